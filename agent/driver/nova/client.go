package nova

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Microversion is the compute API microversion the driver speaks: from
// 2.47 a server embeds its flavor (vcpus, ram, swap), which is how the
// driver sees a server's shape without a flavor lookup per server. A live
// migration (MigrateHost) needs 2.25 for block_migration "auto", and from
// 2.34 Nova checks the target host after it answered.
const Microversion = "2.60"

// Retry limits. Waits are short because the reconciler retries a failed
// Ensure with its own, longer backoff.
const (
	maxRetries    = 4
	retryBase     = 100 * time.Millisecond
	retryMax      = 2 * time.Second
	maxRetryAfter = 30 * time.Second
)

// clients are the service clients of one authenticated session.
type clients struct {
	compute *gophercloud.ServiceClient
	// computeBase speaks microversion 2.1, for os-hypervisors/statistics,
	// which Nova removed in 2.88.
	computeBase *gophercloud.ServiceClient
	volume      *gophercloud.ServiceClient
	network     *gophercloud.ServiceClient
	// image is nil where the catalog has no image service: DiskImages
	// are then refused.
	image     *gophercloud.ServiceClient
	projectID string
}

// connect authenticates as cfg says and finds the region's endpoints. The
// provider client re-authenticates by itself when a token expires
// (AllowReauth), and retries as retryRequest says.
func connect(ctx context.Context, cfg Config) (*clients, error) {
	ao, eo, tlsConfig, err := authOptions(cfg)
	if err != nil {
		return nil, err
	}
	ao.AllowReauth = true
	pc, err := config.NewProviderClient(ctx, ao, config.WithTLSConfig(tlsConfig))
	if err != nil {
		return nil, errors.Errorf("cannot authenticate to OpenStack at %s: %s", ao.IdentityEndpoint, describe(err))
	}
	pc.RetryFunc = retryRequest
	pc.UserAgent.Prepend("virtfleet-agent")
	c := &clients{}
	if c.compute, err = openstack.NewComputeV2(pc, eo); err != nil {
		return nil, errors.Wrapf(err, "no compute endpoint in region %q", eo.Region)
	}
	base := *c.compute
	c.computeBase = &base
	c.compute.Microversion = Microversion
	if c.volume, err = openstack.NewBlockStorageV3(pc, eo); err != nil {
		return nil, errors.Wrapf(err, "no block-storage endpoint in region %q", eo.Region)
	}
	if c.network, err = openstack.NewNetworkV2(pc, eo); err != nil {
		return nil, errors.Wrapf(err, "no network endpoint in region %q", eo.Region)
	}
	if c.image, err = openstack.NewImageV2(pc, eo); err != nil {
		c.image = nil
	}
	if r, ok := pc.GetAuthResult().(tokens.CreateResult); ok {
		if p, err := r.ExtractProject(); err == nil && p != nil {
			c.projectID = p.ID
		}
	}
	if c.projectID == "" {
		return nil, errors.New("the OpenStack token is not scoped to a project; set project_name or project_id for the cloud")
	}
	return c, nil
}

// authOptions reads the credentials: the cloud cfg.Cloud (or OS_CLOUD) of
// cfg.CloudsFile (or the standard clouds.yaml locations), else the OS_*
// environment variables. Errors name the flag to fix and never quote the
// file, which holds a password.
func authOptions(cfg Config) (gophercloud.AuthOptions, gophercloud.EndpointOpts, *tls.Config, error) {
	if cfg.Cloud == "" && os.Getenv("OS_CLOUD") == "" && cfg.CloudsFile == "" {
		ao, err := openstack.AuthOptionsFromEnv()
		if err != nil {
			return ao, gophercloud.EndpointOpts{}, nil, errors.Errorf("--openstack-cloud: no cloud named and the OS_* environment does not authenticate: %s", describe(err))
		}
		region := cfg.Region
		if region == "" {
			region = os.Getenv("OS_REGION_NAME")
		}
		tc, err := envTLS()
		return ao, gophercloud.EndpointOpts{Region: region, Availability: gophercloud.AvailabilityPublic}, tc, err
	}
	var opts []clouds.ParseOption
	if cfg.CloudsFile != "" {
		if _, err := os.Stat(cfg.CloudsFile); err != nil {
			return gophercloud.AuthOptions{}, gophercloud.EndpointOpts{}, nil, errors.Errorf("--openstack-clouds-file: cannot read %s", cfg.CloudsFile)
		}
		opts = append(opts, clouds.WithLocations(cfg.CloudsFile))
	}
	if cfg.Cloud != "" {
		opts = append(opts, clouds.WithCloudName(cfg.Cloud))
	}
	if cfg.Region != "" {
		opts = append(opts, clouds.WithRegion(cfg.Region))
	}
	ao, eo, tc, err := clouds.Parse(opts...)
	switch {
	case err == nil:
		return ao, eo, tc, nil
	case strings.Contains(err.Error(), "not found in clouds.yaml"), strings.Contains(err.Error(), "not a valid cloud name"):
		return ao, eo, nil, errors.Errorf("--openstack-cloud: no cloud %q in the clouds file", cfg.Cloud)
	case strings.Contains(err.Error(), "clouds file not found"):
		return ao, eo, nil, errors.New("--openstack-clouds-file: no clouds.yaml in the standard locations")
	case strings.Contains(err.Error(), "TLS"), strings.Contains(err.Error(), "cert"):
		return ao, eo, nil, errors.Errorf("--openstack-cloud: the cloud's TLS settings are unusable: %s", err)
	default:
		// A YAML error may quote the line it failed on, which may be the
		// password.
		return ao, eo, nil, errors.New("--openstack-clouds-file: the file is not a valid clouds.yaml")
	}
}

// envTLS is the TLS configuration OS_CACERT, OS_CERT, OS_KEY and
// OS_INSECURE give, as cacert, cert, key and verify do in a clouds.yaml.
func envTLS() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if path := os.Getenv("OS_CACERT"); path != "" {
		pem, err := os.ReadFile(path) //nolint:gosec // the operator names the file
		if err != nil {
			return nil, errors.Wrap(err, "OS_CACERT")
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.Errorf("OS_CACERT: %s holds no PEM certificate", path)
		}
	}
	if cert, key := os.Getenv("OS_CERT"), os.Getenv("OS_KEY"); cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, errors.New("OS_CERT, OS_KEY: cannot load the client certificate and key")
		}
		c.Certificates = []tls.Certificate{pair}
	}
	c.InsecureSkipVerify, _ = strconv.ParseBool(os.Getenv("OS_INSECURE")) //nolint:gosec // the operator's explicit choice
	return c, nil
}

// retryRequest is the provider client's RetryFunc: it returns nil to retry
// a failed request and the error to give up.
//
//   - 409 Conflict on anything but creating a named resource is a server busy
//     with another task: retried with backoff. Creating a keypair or flavor
//     that exists already is answered 409 and is not retried: the caller
//     looks it up.
//   - 413 Request Entity Too Large and 429 Too Many Requests with a
//     Retry-After header are rate limits: retried after that long (if at
//     most maxRetryAfter). Without the header a 413 is a quota: not retried.
//   - 500, 502, 503, 504 and transport errors are retried with backoff on
//     idempotent methods only; a POST (a create, an action) may have taken
//     effect, so it is left to the next Ensure, which looks before it acts.
func retryRequest(ctx context.Context, method, url string, _ *gophercloud.RequestOpts, err error, failCount uint) error {
	if failCount > maxRetries {
		return err
	}
	var wait time.Duration
	var code gophercloud.ErrUnexpectedResponseCode
	switch {
	case !errors.As(err, &code):
		if !idempotent(method) {
			return err
		}
		wait = backoff(failCount)
	case code.Actual == http.StatusConflict:
		if method == http.MethodPost && (strings.HasSuffix(url, "/os-keypairs") || strings.HasSuffix(url, "/flavors")) {
			return err
		}
		wait = backoff(failCount)
	case code.Actual == http.StatusRequestEntityTooLarge || code.Actual == http.StatusTooManyRequests:
		after, ok := retryAfter(code.ResponseHeader)
		if !ok || after > maxRetryAfter {
			return err
		}
		wait = after
	case code.Actual >= 500 && code.Actual != http.StatusNotImplemented:
		if !idempotent(method) {
			return err
		}
		wait = backoff(failCount)
	default:
		return err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return err
	case <-t.C:
		return nil
	}
}

func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

func backoff(failCount uint) time.Duration {
	return min(retryBase<<(failCount-1), retryMax)
}

// retryAfter reads a Retry-After header in seconds or as an HTTP date.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// statusOf is the HTTP status of a failed call, 0 for a transport error.
func statusOf(err error) int {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		return code.Actual
	}
	return 0
}

// describe is a short message for a failed call: the service's own message
// and the status, instead of gophercloud's URL and raw body.
func describe(err error) string {
	if err == nil {
		return ""
	}
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) {
		return err.Error()
	}
	var body map[string]json.RawMessage
	msg := ""
	if json.Unmarshal(code.Body, &body) == nil {
		for _, raw := range body {
			var e struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(raw, &e) == nil && e.Message != "" {
				msg = e.Message
				break
			}
		}
	}
	if msg == "" {
		msg = http.StatusText(code.Actual)
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, code.Actual)
}

// classify turns a failed call into the driver's error kinds: 400 is the
// user's input (Terminal); 403 and a 413 left over after retries are quota
// or policy (Failing: shown, retried with backoff); anything else is
// transient.
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	msg := what + ": " + describe(err)
	switch statusOf(err) {
	case http.StatusBadRequest:
		return driver.Terminal(errors.New(msg))
	case http.StatusForbidden, http.StatusRequestEntityTooLarge:
		return driver.Failing(errors.New(msg))
	}
	return errors.New(msg)
}
