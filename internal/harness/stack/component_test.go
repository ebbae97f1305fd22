package stack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helperEnv makes the test binary a stand-in component: "ignore" ignores
// SIGTERM, "obey" stops on it.
const helperEnv = "VIRTFLEET_STACK_HELPER"

// helperReady is what a helper prints once its signal handling is in place.
const helperReady = "ready"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "ignore":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println(helperReady)
		select {}
	case "obey":
		ctx, _ := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		fmt.Println(helperReady)
		<-ctx.Done()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStop: a component that stops on SIGTERM stops cleanly; one that hangs
// is made to print its goroutines into its log, killed, and named.
func TestStop(t *testing.T) {
	cases := map[string]struct {
		helper  string
		wantErr bool
	}{
		"StopsOnSIGTERM": {helper: "obey"},
		"Hangs":          {helper: "ignore", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			log, err := os.Create(filepath.Join(t.TempDir(), "helper.log"))
			require.NoError(t, err)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"="+tc.helper)
			cmd.Stdout, cmd.Stderr = log, log
			require.NoError(t, cmd.Start())
			c := &component{name: "helper", cmd: cmd, done: make(chan error, 1), log: log, grace: time.Second}
			go func() { c.done <- cmd.Wait() }()
			require.Eventually(t, func() bool {
				b, err := os.ReadFile(log.Name())
				return err == nil && strings.Contains(string(b), helperReady)
			}, 10*time.Second, 10*time.Millisecond, "the helper's signal handling is in place")
			err = c.stop(syscall.SIGTERM)
			if !tc.wantErr {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "helper did not stop cleanly")
			b, rerr := os.ReadFile(log.Name())
			require.NoError(t, rerr)
			assert.Contains(t, string(b), "goroutine ", "the log holds the goroutines")
		})
	}
}
