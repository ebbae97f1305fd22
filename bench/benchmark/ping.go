package benchmark

import (
	"cmp"
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// pingInterval is how often a benchmark's prober (guesthost.Prober) asks
// the guest for an echo: the finest pause it can see.
const pingInterval = 10 * time.Millisecond

// startProber starts pinging ip every pingInterval from inside the network
// namespace at netnsPath.
func startProber(netnsPath, ip string) (*guesthost.Prober, error) {
	return guesthost.StartProber(netnsPath, ip, pingInterval)
}

// baselineGap waits for the guest's first answer to p, then returns the
// longest gap between its replies over pingBaseline: what the loaded
// machine's own noise is before anything is done to the guest. It fails
// when the guest does not answer, or stops answering; ctx's end is its
// error.
func baselineGap(ctx context.Context, p *guesthost.Prober) (time.Duration, error) {
	if err := p.WaitAnswer(ctx, time.Now(), answerTimeout); err != nil {
		return 0, cmp.Or(ctx.Err(), errors.Errorf("the guest did not answer the prober within %s", answerTimeout))
	}
	// The window opens once the guest answered, so a reply precedes it.
	from := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(pingBaseline):
	}
	to := time.Now()
	if err := p.WaitAnswer(ctx, to, answerTimeout); err != nil {
		return 0, cmp.Or(ctx.Err(), errors.New("the guest stopped answering the prober"))
	}
	gap, _, _ := p.Gap(from, to)
	return gap, nil
}
