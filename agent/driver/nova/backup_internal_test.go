package nova

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// recorder is a BackupWriter that writes down what it is handed.
type recorder struct{ calls []string }

func (r *recorder) Disk(d driver.BackupDisk) error {
	r.calls = append(r.calls, fmt.Sprintf("disk %s %d", d.Name, d.Size))
	return nil
}

func (r *recorder) Data(off int64, p []byte) error {
	r.calls = append(r.calls, fmt.Sprintf("data %d+%d", off, len(p)))
	return nil
}

func (r *recorder) Zero(off, length int64) error {
	r.calls = append(r.calls, fmt.Sprintf("zero %d+%d", off, length))
	return nil
}

// TestHandDiskHandsDataAndRunsOfZeros pins how a raw disk read from Glance
// is handed to the store: chunk windows of data as Data, runs of zero
// windows as one Zero, and a body of another length than the disk fails.
func TestHandDiskHandsDataAndRunsOfZeros(t *testing.T) {
	const mib = 1 << 20
	disk := func(size int64, data ...int64) []byte {
		p := make([]byte, size)
		for _, off := range data {
			p[off] = 1
		}
		return p
	}
	cases := []struct {
		name    string
		size    int64
		body    []byte
		want    []string
		read    int64
		failure string
	}{
		{name: "AllZeros", size: 3 * mib, body: disk(3 * mib), want: []string{"disk d 3145728", "zero 0+3145728"}, read: 3 * mib},
		{name: "DataBetweenZeros", size: 4 * mib, body: disk(4*mib, mib+5), want: []string{"disk d 4194304", "zero 0+1048576", "data 1048576+1048576", "zero 2097152+2097152"}, read: 4 * mib},
		{name: "AShortLastWindow", size: 2*mib + 10, body: disk(2*mib+10, 0, 2*mib+9), want: []string{"disk d 2097162", "data 0+1048576", "zero 1048576+1048576", "data 2097152+10"}, read: 2*mib + 10},
		{name: "ABodyShorterThanTheDisk", size: 2 * mib, body: disk(mib + 7), failure: "Glance gave 1048583 of its 2097152 bytes", read: mib + 7},
		{name: "ABodyLongerThanTheDisk", size: mib, body: disk(mib + 1), failure: "Glance gave more than its 1048576 bytes", read: mib},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &recorder{}
			read, err := handDisk(driver.BackupDisk{Name: "d", Size: tc.size}, bytes.NewReader(tc.body), w)
			assert.Equal(t, tc.read, read)
			if tc.failure != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.failure)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, w.calls)
		})
	}
}
