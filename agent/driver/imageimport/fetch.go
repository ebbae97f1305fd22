package imageimport

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The agent downloads what a tenant's DiskImage names, from the node, which
// reaches what the tenant cannot: its own loopback services, the cloud's
// metadata service, the cluster's private networks. So an image download
// connects only to public addresses and to those in the image's
// AllowedSources, checked on the address actually dialled (after DNS, at
// every redirect), and is bounded in size, time and number. CheckSource
// applies the same policy, as far as it can, to a URL another component
// downloads.

// maxRedirects is how many redirects one image download follows.
const maxRedirects = 5

// Timeouts of the steps of a download that must not take long; the whole
// download is bounded by the image download timeout.
const (
	dialTimeout         = 30 * time.Second
	tlsHandshakeTimeout = 30 * time.Second
)

// refusal marks the errors of a download the node refuses by policy: the
// image, or its server, has to change before a retry could succeed.
type refusal interface {
	error
	refused()
}

// IsRefusal reports whether err, or any error it wraps, is one the node's
// policy caused (an address, scheme, redirect or size it refuses, an unsafe
// image): no retry mends it, only a changed image or grant.
func IsRefusal(err error) bool {
	return refusalOf(err) != nil
}

// refusalOf returns the refusal err wraps, or nil.
func refusalOf(err error) refusal {
	var r refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// AddressRefusedError is a connection refused because its address is not
// public and not among the image's allowed sources.
type AddressRefusedError struct {
	// Host is the host as the URL or a redirect named it; empty while only
	// the address is known.
	Host string
	// Addr is the address that would have been dialled.
	Addr netip.Addr
	// Class says why the address is not public, e.g. loopback.
	Class string
}

func (*AddressRefusedError) refused() {}

// Error names the host and the kind of address, and the address itself only
// when the host is that address: what a name resolves to on the node is not
// the tenant's to learn.
func (e *AddressRefusedError) Error() string {
	if e.Host == "" || e.Host == e.Addr.String() {
		return fmt.Sprintf("address %s is %s and not among the image's allowed sources: refused", e.Addr, e.Class)
	}
	return fmt.Sprintf("host %s resolves to a %s address, not among the image's allowed sources: refused", e.Host, e.Class)
}

// SchemeRefusedError is a URL, or a redirect, to a scheme other than http
// and https.
type SchemeRefusedError struct {
	Scheme string
}

func (*SchemeRefusedError) refused() {}

func (e *SchemeRefusedError) Error() string {
	return fmt.Sprintf("scheme %q is not http or https: refused", e.Scheme)
}

// RedirectsRefusedError is a download redirected more often than
// maxRedirects.
type RedirectsRefusedError struct {
	Host string
	Max  int
}

func (*RedirectsRefusedError) refused() {}

func (e *RedirectsRefusedError) Error() string {
	return fmt.Sprintf("host %s redirected more than %d times: refused", e.Host, e.Max)
}

// TooLargeError is a download larger than the node accepts.
type TooLargeError struct {
	Host string
	// Size is the size the server announced, or -1 when the body grew past
	// Max without one.
	Size int64
	Max  int64
}

func (*TooLargeError) refused() {}

func (e *TooLargeError) Error() string {
	limit := fmt.Sprintf("this node's limit of %d bytes (%s)", e.Max, resource.NewQuantity(e.Max, resource.BinarySI))
	if e.Size < 0 {
		return fmt.Sprintf("the image from %s grew past %s: refused", e.Host, limit)
	}
	return fmt.Sprintf("the image from %s is %d bytes, over %s: refused", e.Host, e.Size, limit)
}

// Address classes outside the public internet that netip has no predicate
// for.
var (
	sharedPrefix      = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT, RFC 6598
	thisNetworkPrefix = netip.MustParsePrefix("0.0.0.0/8")     // RFC 1122
	reservedPrefix    = netip.MustParsePrefix("240.0.0.0/4")   // RFC 1112, never routed
	siteLocalPrefix   = netip.MustParsePrefix("fec0::/10")     // deprecated, still private
	nat64Prefix       = netip.MustParsePrefix("64:ff9b::/96")  // RFC 6052, embeds an IPv4 address
	broadcast         = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// addressClass says why a is not a public address, or returns "" for a
// public one. An IPv4-mapped IPv6 address, or one of the well-known NAT64
// prefix, is the IPv4 address it carries.
func addressClass(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if nat64Prefix.Contains(a) {
		b := a.As16()
		return addressClass(netip.AddrFrom4([4]byte(b[12:])))
	}
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified() || thisNetworkPrefix.Contains(a):
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a == broadcast:
		return "broadcast"
	case a.IsMulticast():
		return "multicast"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.Is4() && a.IsPrivate():
		return "private"
	case a.IsPrivate():
		return "unique-local"
	case sharedPrefix.Contains(a):
		return "shared"
	case reservedPrefix.Contains(a):
		return "reserved"
	case siteLocalPrefix.Contains(a):
		return "site-local"
	}
	return ""
}

// allowedAddress reports whether a download may connect to a: a public
// address, or one inside allowed. An IPv4-mapped address is compared as the
// IPv4 address, against IPv4 and IPv4-mapped prefixes alike.
func allowedAddress(a netip.Addr, allowed []netip.Prefix) error {
	class := addressClass(a)
	if class == "" {
		return nil
	}
	a = a.Unmap().WithZone("")
	for _, p := range allowed {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Contains(a) {
			return nil
		}
	}
	return &AddressRefusedError{Addr: a, Class: class}
}

// checkScheme refuses a URL that is not http or https.
func checkScheme(u *url.URL) error {
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return &SchemeRefusedError{Scheme: u.Scheme}
	}
	return nil
}

// parseSource parses the URL of an image and refuses one that is not http
// or https.
func parseSource(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.Errorf("bad URL %q: %v", rawURL, err)
	}
	return u, checkScheme(u)
}

// CheckSource checks rawURL against the download policy without fetching
// it, for a backend whose images someone else downloads (KubeVirt's CDI,
// say): it refuses a scheme other than http and https, and a host that is,
// or resolves to, an address neither public nor inside allowed, with the
// errors a download would return (IsRefusal). Every address the host
// resolves to must pass, since the fetcher may connect to any.
//
// It checks only what it can see from here, once. The fetcher that comes
// later resolves the host again, and may be answered differently (DNS
// rebinding), and follows redirects this never sees: where it matters, that
// fetcher must enforce the policy itself, or reach only what it may.
func CheckSource(ctx context.Context, rawURL string, allowed []netip.Prefix) error {
	u, err := parseSource(rawURL)
	if err != nil {
		return err
	}
	host := u.Hostname()
	if host == "" {
		return errors.Errorf("URL %q names no host", rawURL)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return allowedAddress(a, allowed)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return errors.Wrapf(err, "cannot resolve host %s", host)
	}
	for _, a := range addrs {
		var refused *AddressRefusedError
		if errors.As(allowedAddress(a, allowed), &refused) {
			refused.Host = host
			return refused
		}
	}
	return nil
}

// fetchClient is the client of one download: it dials only addresses
// allowed says, checked on the address being connected to, so neither a
// name resolving differently from one lookup to the next nor a redirect
// gets past the check. It uses no proxy, whose address would be the only
// one checked, and keeps no connection for another download, whose image
// may allow other sources.
func fetchClient(allowed []netip.Prefix) *http.Client {
	dialer := &net.Dialer{
		Timeout: dialTimeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return errors.Wrapf(err, "cannot parse the address %q being dialled", address)
			}
			return allowedAddress(ap.Addr(), allowed)
		},
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				c, err := dialer.DialContext(ctx, network, address)
				var refused *AddressRefusedError
				if errors.As(err, &refused) {
					refused.Host, _, _ = net.SplitHostPort(address)
					return nil, refused
				}
				return c, err
			},
			TLSHandshakeTimeout: tlsHandshakeTimeout,
			DisableKeepAlives:   true,
			ForceAttemptHTTP2:   true,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if err := checkScheme(req.URL); err != nil {
				return err
			}
			if len(via) > maxRedirects {
				return &RedirectsRefusedError{Host: via[0].URL.Hostname(), Max: maxRedirects}
			}
			return nil
		},
	}
}
