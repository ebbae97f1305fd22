package kubevirt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/virtfleet/virtfleet/agent/driver"
)

func TestBackUpIsRefusedWithTheReason(t *testing.T) {
	e := newEnv(t)
	m := e.running()
	cases := map[string]struct {
		uid      string
		notFound bool
	}{
		"ARunningGuestIsRefusedAsTerminal": {uid: m.UID},
		"AGuestThatIsNotThereIsNotFound":   {uid: string(uuid.NewUUID()), notFound: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := e.d.BackUp(context.Background(), tc.uid, driver.BackupRequest{ID: "b-1"}, nil)
			require.Error(t, err)
			if tc.notFound {
				assert.True(t, driver.IsNotFound(err), "%v", err)
				return
			}
			assert.True(t, driver.IsTerminal(err), "%v", err)
			assert.Contains(t, err.Error(), "kubevirt.io/api v1.7.0, which virtfleet speaks to KubeVirt, has no backup kind")
		})
	}
	require.NoError(t, e.d.CommitBackup(context.Background(), m.UID, "b-1"), "nothing to forget")
}
