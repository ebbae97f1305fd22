package imageimport

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// countingServer serves h on addr (host:0) and counts the requests it
// receives.
func countingServer(t *testing.T, addr string, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var n atomic.Int32
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h(w, r)
	}))
	require.NoError(t, s.Listener.Close())
	s.Listener = l
	s.Start()
	t.Cleanup(s.Close)
	return s, &n
}

// serveBytes answers every request with data, with its Content-Length.
func serveBytes(data []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "disk.img", time.Time{}, bytes.NewReader(data))
	}
}

// streamBytes answers with n bytes in flushed chunks and no Content-Length,
// stopping early when the client goes.
func streamBytes(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 256)
		for sent := 0; sent < n; sent += len(chunk) {
			if _, err := w.Write(chunk[:min(len(chunk), n-sent)]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

func redirectTo(url string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, url, http.StatusFound) }
}

// loopback is the allowed source of the images the tests serve.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// prefixes parses ps.
func prefixes(ps ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// fetch runs one download of url by a store configured as cfg, and returns
// what it wrote.
func fetch(t *testing.T, cfg Config, url string, allowed ...string) ([]byte, *Job, error) {
	t.Helper()
	cfg.Dir = t.TempDir()
	s := New(cfg)
	img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000901", Name: "ubuntu", URL: url, Format: "raw", AllowedSources: prefixes(allowed...)}
	job := s.newJob("", 0)
	path, _, err := job.Download(context.Background(), img)
	left, _ := filepath.Glob(filepath.Join(cfg.Dir, "*"))
	if err != nil {
		assert.Empty(t, left, "a failed download leaves nothing")
		return nil, job, err
	}
	assert.Equal(t, []string{path}, left)
	data, rerr := os.ReadFile(path) //nolint:gosec // the test's download
	require.NoError(t, rerr)
	return data, job, nil
}

func TestDownloadConnectsOnlyToAllowedAddresses(t *testing.T) {
	data := []byte("an image")
	cases := map[string]struct {
		host    string
		allowed []string
		wantErr string
	}{
		"LoopbackIsRefusedWithoutAllowedSources": {
			host:    "127.0.0.1",
			wantErr: "cannot import image ubuntu: address 127.0.0.1 is loopback and not among the image's allowed sources: refused",
		},
		"AnotherAllowedRangeDoesNotAllowLoopback": {
			host:    "127.0.0.1",
			allowed: []string{"10.0.0.0/8", "::1/128"},
			wantErr: "cannot import image ubuntu: address 127.0.0.1 is loopback and not among the image's allowed sources: refused",
		},
		"ANameIsCheckedOnTheAddressItResolvesTo": {
			host:    "localhost",
			wantErr: "cannot import image ubuntu: host localhost resolves to a loopback address, not among the image's allowed sources: refused",
		},
		"AllowedLoopbackIsDownloaded":  {host: "127.0.0.1", allowed: []string{"127.0.0.0/8"}},
		"AnAllowedAddressIsEnough":     {host: "127.0.0.1", allowed: []string{"127.0.0.1/32"}},
		"AnIPv4MappedAllowedSourceToo": {host: "127.0.0.1", allowed: []string{"::ffff:127.0.0.1/128"}},
		"AnAllowedNameIsDownloadedToo": {host: "localhost", allowed: []string{"127.0.0.0/8", "::1/128"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv, requests := countingServer(t, "127.0.0.1:0", serveBytes(data))
			_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
			require.NoError(t, err)

			got, _, err := fetch(t, Config{}, "http://"+net.JoinHostPort(tc.host, port)+"/disk.img", tc.allowed...)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, data, got)
				assert.Equal(t, int32(1), requests.Load())
				return
			}
			require.EqualError(t, err, tc.wantErr)
			assert.True(t, IsRefusal(err), "no retry mends it")
			assert.Zero(t, requests.Load(), "the server never hears of the download")
		})
	}
}

// TestRedirectsAreCheckedHopByHop: both servers are on loopback, so only a
// check of each hop's own address tells them apart.
func TestRedirectsAreCheckedHopByHop(t *testing.T) {
	data := []byte("an image")
	cases := map[string]struct {
		// to is where the first server redirects; %s is the second server's
		// URL.
		to              func(first, second string) string
		allowed         []string
		wantErr         string
		firstN, secondN int32
	}{
		"ToAnAddressNotAllowed": {
			to:      func(_, second string) string { return second },
			allowed: []string{"127.0.0.1/32"},
			wantErr: "cannot import image ubuntu: address 127.0.0.2 is loopback and not among the image's allowed sources: refused",
			firstN:  1,
		},
		"ToAnAllowedAddress": {
			to:      func(_, second string) string { return second },
			allowed: []string{"127.0.0.1/32", "127.0.0.2/32"},
			firstN:  1, secondN: 1,
		},
		"ToAnotherScheme": {
			to:      func(string, string) string { return "file:///etc/passwd" },
			allowed: []string{"127.0.0.0/8"},
			wantErr: `cannot import image ubuntu: scheme "file" is not http or https: refused`,
			firstN:  1,
		},
		"OverAndOverAgain": {
			to:      func(first, _ string) string { return first },
			allowed: []string{"127.0.0.0/8"},
			wantErr: "cannot import image ubuntu: host 127.0.0.1 redirected more than 5 times: refused",
			firstN:  maxRedirects + 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			second, secondN := countingServer(t, "127.0.0.2:0", serveBytes(data))
			var to atomic.Value
			first, firstN := countingServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
				redirectTo(to.Load().(string))(w, r)
			})
			to.Store(tc.to(first.URL+"/disk.img", second.URL+"/disk.img"))

			got, _, err := fetch(t, Config{}, first.URL+"/disk.img", tc.allowed...)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, data, got)
			} else {
				require.EqualError(t, err, tc.wantErr)
				assert.True(t, IsRefusal(err))
			}
			assert.Equal(t, tc.firstN, firstN.Load(), "requests to the first server")
			assert.Equal(t, tc.secondN, secondN.Load(), "requests to the second server")
		})
	}
}

func TestOnlyHTTPAndHTTPSAreFetched(t *testing.T) {
	for _, url := range []string{"file:///etc/passwd", "ftp://127.0.0.1/disk.img", "gopher://127.0.0.1/"} {
		t.Run(url, func(t *testing.T) {
			_, _, err := fetch(t, Config{}, url, "127.0.0.0/8")
			require.ErrorContains(t, err, "is not http or https: refused")
			assert.True(t, IsRefusal(err))
		})
	}
}

func TestDownloadSizeCap(t *testing.T) {
	const limit = 1024
	cases := map[string]struct {
		handler http.HandlerFunc
		wantErr string
		// maxRead bounds what the download wrote before it stopped.
		maxRead int64
	}{
		"AnnouncedOverTheCapIsRefusedBeforeReading": {
			handler: serveBytes(make([]byte, 2*limit)),
			wantErr: "cannot import image ubuntu: the image from 127.0.0.1 is 2048 bytes, over this node's limit of 1024 bytes (1Ki): refused",
		},
		"UnannouncedIsStoppedPastTheCap": {
			handler: streamBytes(100 * limit),
			wantErr: "cannot import image ubuntu: the image from 127.0.0.1 grew past this node's limit of 1024 bytes (1Ki): refused",
			maxRead: limit + 1,
		},
		"AnnouncedAtTheCapIsDownloaded":   {handler: serveBytes(make([]byte, limit)), maxRead: limit},
		"UnannouncedAtTheCapIsDownloaded": {handler: streamBytes(limit), maxRead: limit},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv, _ := countingServer(t, "127.0.0.1:0", tc.handler)
			got, job, err := fetch(t, Config{MaxBytes: limit}, srv.URL+"/disk.img", "127.0.0.0/8")
			assert.LessOrEqual(t, job.read.Load(), tc.maxRead)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, got, limit)
				return
			}
			require.EqualError(t, err, tc.wantErr)
			assert.True(t, IsRefusal(err))
		})
	}
}

func TestDownloadTimeCap(t *testing.T) {
	const limit = 200 * time.Millisecond
	// Both servers hold the response until the client goes away.
	cases := map[string]http.HandlerFunc{
		"NoAnswer": func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
		"ABodyThatNeverEnds": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000000")
			_, _ = w.Write([]byte("QFI"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			srv, _ := countingServer(t, "127.0.0.1:0", h)
			_, _, err := fetch(t, Config{Timeout: limit}, srv.URL+"/disk.img", "127.0.0.0/8")
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the download did not finish within this node's limit of 200ms")
			assert.False(t, IsRefusal(err), "a slow server may be faster next time")
		})
	}
}

func TestDownloadsWaitForASlot(t *testing.T) {
	gate := make(chan struct{})
	var once atomic.Bool
	release := func() {
		if once.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(release)
	srv, requests := countingServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
		<-gate
		serveBytes([]byte("an image"))(w, r)
	})
	s := New(Config{Dir: t.TempDir(), Downloads: 1})
	img := func(uid string) *driver.Image {
		return &driver.Image{UID: uid, Name: uid, URL: srv.URL + "/disk.img", Format: "raw", AllowedSources: loopback}
	}
	first, second := s.newJob("", 0), s.newJob("", 0)
	errs := make(chan error, 2)
	go func() {
		_, _, err := first.Download(context.Background(), img("first"))
		errs <- err
	}()
	require.Eventually(t, func() bool { return requests.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "the first download is under way")
	go func() {
		_, _, err := second.Download(context.Background(), img("second"))
		errs <- err
	}()
	require.Eventually(t, second.queued.Load, 5*time.Second, 10*time.Millisecond, "the second download waits")
	assert.Equal(t, "importing image second: waiting for a download slot", second.progress("second"))
	assert.Equal(t, int32(1), requests.Load(), "one download at a time")
	assert.False(t, first.queued.Load())

	release()
	for range 2 {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, int32(2), requests.Load())
	assert.False(t, second.queued.Load())
	assert.True(t, strings.HasPrefix(second.progress("second"), "importing image second: 8 of 8 bytes"))
}

func TestAddressClass(t *testing.T) {
	cases := map[string]string{
		"8.8.8.8":                "",
		"2001:4860:4860::8888":   "",
		"::ffff:8.8.8.8":         "",
		"64:ff9b::808:808":       "",
		"100.63.255.255":         "",
		"100.128.0.0":            "",
		"127.0.0.1":              "loopback",
		"127.255.255.254":        "loopback",
		"::1":                    "loopback",
		"::ffff:127.0.0.1":       "loopback",
		"169.254.169.254":        "link-local",
		"::ffff:169.254.169.254": "link-local",
		"fe80::1":                "link-local",
		"fe80::1%eth0":           "link-local",
		"10.1.2.3":               "private",
		"172.16.0.1":             "private",
		"172.31.255.255":         "private",
		"192.168.1.1":            "private",
		"::ffff:10.0.0.1":        "private",
		"64:ff9b::a00:1":         "private",
		"100.64.0.1":             "shared",
		"100.127.255.255":        "shared",
		"fc00::1":                "unique-local",
		"fd12:3456::1":           "unique-local",
		"fec0::1":                "site-local",
		"0.0.0.0":                "unspecified",
		"0.1.2.3":                "unspecified",
		"::":                     "unspecified",
		"::ffff:0.0.0.0":         "unspecified",
		"224.0.0.1":              "multicast",
		"239.255.255.250":        "multicast",
		"ff02::1":                "multicast",
		"ff0e::1":                "multicast",
		"255.255.255.255":        "broadcast",
		"240.0.0.1":              "reserved",
	}
	for addr, want := range cases {
		t.Run(addr, func(t *testing.T) {
			assert.Equal(t, want, addressClass(netip.MustParseAddr(addr)))
		})
	}
}

func TestAllowedAddress(t *testing.T) {
	cases := map[string]struct {
		addr    string
		allowed []netip.Prefix
		want    bool
	}{
		"APublicAddressNeedsNoGrant":              {addr: "8.8.8.8", want: true},
		"APublicIPv6AddressNeedsNoGrant":          {addr: "2001:db8::1", want: true},
		"APrivateAddressNeedsOne":                 {addr: "10.1.2.3"},
		"APrivateAddressInAnAllowedRange":         {addr: "10.1.2.3", allowed: prefixes("10.0.0.0/8"), want: true},
		"APrivateAddressOutsideTheAllowedRange":   {addr: "10.1.2.3", allowed: prefixes("10.0.0.0/16")},
		"AMappedAddressInAnIPv4Range":             {addr: "::ffff:10.1.2.3", allowed: prefixes("10.0.0.0/8"), want: true},
		"AnIPv4AddressInAMappedRange":             {addr: "10.1.2.3", allowed: prefixes("::ffff:10.0.0.0/104"), want: true},
		"AMappedAddressOutsideTheRange":           {addr: "::ffff:192.168.0.1", allowed: prefixes("10.0.0.0/8")},
		"MetadataIsRefusedBesideAnAllowedRange":   {addr: "169.254.169.254", allowed: prefixes("10.0.0.0/8", "fd00::/8")},
		"MetadataIsAllowedOnlyWhenGranted":        {addr: "169.254.169.254", allowed: prefixes("169.254.169.254/32"), want: true},
		"AZonedLinkLocalAddressInAnAllowedRange":  {addr: "fe80::1%eth0", allowed: prefixes("fe80::/10"), want: true},
		"AnIPv6RangeDoesNotAllowIPv4":             {addr: "127.0.0.1", allowed: prefixes("::1/128")},
		"AnUniqueLocalAddressInAnAllowedRange":    {addr: "fd12::5", allowed: prefixes("fd12::/16"), want: true},
		"AnUniqueLocalAddressOutsideAnAllowedOne": {addr: "fd13::5", allowed: prefixes("fd12::/16")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := allowedAddress(netip.MustParseAddr(tc.addr), tc.allowed)
			if tc.want {
				assert.NoError(t, err)
				return
			}
			var refused *AddressRefusedError
			require.ErrorAs(t, err, &refused)
			assert.NotEmpty(t, refused.Class)
		})
	}
}

// TestCheckSource checks URLs against the policy without fetching them:
// the same refusals as a download's, from what the host resolves to here.
func TestCheckSource(t *testing.T) {
	cases := map[string]struct {
		url     string
		allowed []string
		wantErr string
		refusal bool
	}{
		"APublicAddressPasses":     {url: "https://8.8.8.8/disk.qcow2"},
		"APublicIPv6AddressPasses": {url: "http://[2001:4860:4860::8888]:8080/disk.qcow2"},
		"AnAllowedAddressPasses":   {url: "http://10.1.2.3/disk.qcow2", allowed: []string{"10.0.0.0/8"}},
		"AnAllowedNamePasses":      {url: "http://localhost/disk.qcow2", allowed: []string{"127.0.0.0/8", "::1/128"}},
		"LoopbackIsRefused": {
			url:     "http://127.0.0.1:8080/disk.qcow2",
			wantErr: "address 127.0.0.1 is loopback and not among the image's allowed sources: refused",
			refusal: true,
		},
		"TheMetadataServiceIsRefused": {
			url:     "http://169.254.169.254/latest/meta-data/",
			allowed: []string{"10.0.0.0/8"},
			wantErr: "address 169.254.169.254 is link-local and not among the image's allowed sources: refused",
			refusal: true,
		},
		"ANameIsCheckedOnTheAddressesItResolvesTo": {
			url:     "http://localhost/disk.qcow2",
			allowed: []string{"10.0.0.0/8"},
			wantErr: "host localhost resolves to a loopback address, not among the image's allowed sources: refused",
			refusal: true,
		},
		"AnotherSchemeIsRefused": {
			url:     "file:///etc/passwd",
			allowed: []string{"127.0.0.0/8"},
			wantErr: `scheme "file" is not http or https: refused`,
			refusal: true,
		},
		"AURLWithoutHostIsBad": {url: "http:///disk.qcow2", wantErr: `URL "http:///disk.qcow2" names no host`},
		"AnUnparsableURLIsBad": {url: "http://[::1/disk.qcow2", wantErr: `bad URL "http://[::1/disk.qcow2"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := CheckSource(context.Background(), tc.url, prefixes(tc.allowed...))
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			assert.Equal(t, tc.refusal, IsRefusal(err))
		})
	}
}
