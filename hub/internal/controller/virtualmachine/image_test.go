package virtualmachine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// fromImage is an unbound Volume made from the DiskImage image.
func fromImage(name, image string) *v1alpha1.Volume {
	v := vol(name, "")
	v.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(image)}}
	return v
}

func TestResolveImages(t *testing.T) {
	raw := v1alpha1.DiskFormatRaw
	img := &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ubuntu", UID: "img-1"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source:     v1alpha1.DiskImageSource{URL: "http://127.0.0.1/u.img", SHA256: "ab"},
			Format:     &raw,
			PruneAfter: &metav1.Duration{Duration: 30 * time.Minute},
		}},
	}
	machine := vm(func(m *v1alpha1.VirtualMachine) { m.Spec.ForProvider.VirtualNetworks = nil })

	t.Run("AMissingImageKeepsTheVMWaitingAndSaysForWhat", func(t *testing.T) {
		_, err := resolve(context.Background(), kube(t, fromImage("root", "ubuntu"), fromImage("data", "ubuntu")), machine)
		var missing *MissingError
		require.True(t, errors.As(err, &missing), "%v", err)
		assert.Equal(t, []string{"ubuntu"}, missing.Images, "named once however many volumes use it")
		assert.EqualError(t, err, "waiting for DiskImage ubuntu in namespace default: create them and the VM goes on by itself")
	})
	t.Run("TheIntentCarriesTheResolvedImageOnItsVolumeOnly", func(t *testing.T) {
		d, err := resolve(context.Background(), kube(t, fromImage("root", "ubuntu"), vol("data", ""), img), machine)
		require.NoError(t, err)
		in := intent(machine, d)
		require.Len(t, in.Machine.Disks, 2)
		assert.Equal(t, &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.img", Checksum: "ab", Format: "raw", PruneAfterSeconds: 1800}, in.Machine.Disks[0].Image)
		assert.Nil(t, in.Machine.Disks[1].Image)
	})
}
