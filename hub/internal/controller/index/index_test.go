package index

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
)

func TestUses(t *testing.T) {
	vm := &v1alpha1.VirtualMachine{}
	vm.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}, {Name: "data"}}
	vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"net-db", "net-backend"}
	fromImage := &v1alpha1.Volume{}
	fromImage.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "debian"}}

	cases := map[string]struct {
		user inuse.User
		obj  client.Object
		want []string
	}{
		"AVMUsesItsDisksVolumesInOrder":    {user: VolumeUsers, obj: vm, want: []string{"root", "data"}},
		"AVMUsesItsNetworksInOrder":        {user: NetworkUsers, obj: vm, want: []string{"net-db", "net-backend"}},
		"AVolumeUsesTheImageItIsMadeFrom":  {user: ImageUsers, obj: fromImage, want: []string{"debian"}},
		"AnEmptyVolumeUsesNoImage":         {user: ImageUsers, obj: &v1alpha1.Volume{}},
		"AnObjectOfAnotherKindUsesNothing": {user: VolumeUsers, obj: &v1alpha1.Volume{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.user.Uses(tc.obj))
		})
	}
}
