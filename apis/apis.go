// Package apis registers every virtfleet API group.
package apis

import (
	"k8s.io/apimachinery/pkg/runtime"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	virtfleetv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

// AddToSchemes adds every virtfleet group to a scheme.
var AddToSchemes = runtime.SchemeBuilder{
	virtfleetv1alpha1.SchemeBuilder.AddToScheme,
	computev1alpha1.SchemeBuilder.AddToScheme,
}

// AddToScheme adds every virtfleet group to s.
func AddToScheme(s *runtime.Scheme) error {
	return AddToSchemes.AddToScheme(s)
}
