package benchmark

import (
	"bufio"
	"context"
	"io"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// requestsMetric counts the API server's requests by verb, resource and
// subresource; counting it before and after a scenario gives the writes the
// scenario caused without an audit log.
const requestsMetric = "apiserver_request_total"

// writeVerbs are the verbs of apiserver_request_total that change state.
// Server-side apply is counted as APPLY, not PATCH.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// RequestKey is one series of apiserver_request_total, with the labels the
// benchmark tells apart; other labels (code, scope, version...) are summed.
type RequestKey struct {
	Group       string `json:"group"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource,omitempty"`
	Verb        string `json:"verb"`
	// Code is the HTTP status: a 409 is a write lost to a conflict, which
	// the writer must read and make again.
	Code string `json:"code"`
}

// String reads as "PUT virtualmachines/status 200".
func (k RequestKey) String() string {
	r := k.Resource
	if k.Subresource != "" {
		r += "/" + k.Subresource
	}
	return k.Verb + " " + r + " " + k.Code
}

// RequestCounts are the API server's request counters at one moment.
type RequestCounts map[RequestKey]float64

// ParseRequestCounts reads apiserver_request_total out of the Prometheus text
// exposition format. It is deliberately small: one counter family, whose
// labels are plain strings, is all the benchmark needs.
func ParseRequestCounts(r io.Reader) (RequestCounts, error) {
	out := RequestCounts{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, requestsMetric+"{") {
			continue
		}
		labels, rest, err := parseLabels(line[len(requestsMetric)+1:])
		if err != nil {
			return nil, errors.Wrapf(err, "cannot parse %q", line)
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, errors.Errorf("no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot parse the value of %q", line)
		}
		k := RequestKey{Group: labels["group"], Resource: labels["resource"], Subresource: labels["subresource"], Verb: labels["verb"], Code: labels["code"]}
		out[k] += v
	}
	return out, errors.Wrap(sc.Err(), "cannot read the metrics")
}

// parseLabels parses `k="v",k2="v2"}` and returns the labels and what follows
// the closing brace.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.Index(s, "=")
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return nil, "", errors.New("malformed label")
		}
		name := s[:eq]
		s = s[eq+2:]
		var v strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			if c == '"' {
				s, closed = s[i+1:], true
				break
			}
			v.WriteByte(c)
		}
		if !closed {
			return nil, "", errors.New("unterminated label value")
		}
		labels[name] = v.String()
	}
}

// Requests are the requests made between two snapshots, by series.
type Requests map[RequestKey]float64

// Between is after minus before, over the series keep selects.
func Between(before, after RequestCounts, keep func(RequestKey) bool) Requests {
	out := Requests{}
	for k, v := range after {
		if !keep(k) {
			continue
		}
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// WritesBetween is after minus before, over the write verbs of group.
func WritesBetween(before, after RequestCounts, group string) Requests {
	return Between(before, after, func(k RequestKey) bool { return k.Group == group && writeVerbs[k.Verb] })
}

// Total sums every request of w.
func (w Requests) Total() float64 {
	var n float64
	for _, v := range w {
		n += v
	}
	return n
}

// Resource sums the writes to one resource, subresources and failed
// writes included: each is a request the API server had to serve.
func (w Requests) Resource(resource string) float64 {
	var n float64
	for k, v := range w {
		if k.Resource == resource {
			n += v
		}
	}
	return n
}

// RequestCount is one row of a breakdown, for the report.
type RequestCount struct {
	Request string  `json:"request"`
	Count   float64 `json:"count"`
	PerVM   float64 `json:"perVM"`
}

// Breakdown lists the requests per kind, most frequent first.
func (w Requests) Breakdown(vms int) []RequestCount {
	out := make([]RequestCount, 0, len(w))
	for k, v := range w {
		out = append(out, RequestCount{Request: k.String(), Count: v, PerVM: v / float64(max(vms, 1))})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Request < out[j].Request
	})
	return out
}

// FetchRequestCounts scrapes the API server's /metrics with cfg's
// credentials (the stack's admin may read it).
func FetchRequestCounts(ctx context.Context, cfg *rest.Config) (RequestCounts, error) {
	return scrapeAPIServer(ctx, cfg, ParseRequestCounts)
}

// scrapeAPIServer reads the API server's /metrics with cfg's credentials
// and parses them.
func scrapeAPIServer[T any](ctx context.Context, cfg *rest.Config, parse func(io.Reader) (T, error)) (T, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		var zero T
		return zero, errors.Wrap(err, "cannot build an HTTP client for the API server")
	}
	return scrapeMetrics(ctx, hc, strings.TrimSuffix(cfg.Host, "/")+"/metrics", "the API server", parse)
}
