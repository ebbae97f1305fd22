package benchmark

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const group = "compute.virtfleet.io"

// A trimmed scrape of kube-apiserver v1.34.
const scrape = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="virtualmachines",scope="resource",subresource="",verb="POST",version="v1alpha1"} 10
apiserver_request_total{code="409",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="virtualmachines",scope="resource",subresource="",verb="PUT",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="virtualmachines",scope="resource",subresource="",verb="PUT",version="v1alpha1"} 20
apiserver_request_total{code="200",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="virtualmachines",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="virtualmachines",scope="namespace",subresource="",verb="WATCH",version="v1alpha1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="compute.virtfleet.io",resource="volumes",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 10
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 20
apiserver_request_duration_seconds_bucket{group="compute.virtfleet.io",resource="virtualmachines",verb="PUT",le="0.005"} 99
`

func TestParseRequestCountsKeepsCodesApart(t *testing.T) {
	c, err := ParseRequestCounts(strings.NewReader(scrape))
	require.NoError(t, err)
	assert.Equal(t, 20.0, c[RequestKey{Group: group, Resource: "virtualmachines", Verb: "PUT", Code: "200"}])
	assert.Equal(t, 2.0, c[RequestKey{Group: group, Resource: "virtualmachines", Verb: "PUT", Code: "409"}], "conflicts are told apart")
	assert.Equal(t, 30.0, c[RequestKey{Group: group, Resource: "virtualmachines", Subresource: "status", Verb: "PUT", Code: "200"}])
	assert.Equal(t, 20.0, c[RequestKey{Resource: "events", Verb: "POST", Code: "201"}])
	assert.Len(t, c, 7, "other metric families are ignored")
}

func TestParseRequestCountsRejectsMalformedLines(t *testing.T) {
	for name, line := range map[string]string{
		"UnterminatedValue": `apiserver_request_total{verb="PUT} 1`,
		"NoValue":           `apiserver_request_total{verb="PUT"}`,
		"BadValue":          `apiserver_request_total{verb="PUT"} x`,
		"UnquotedLabel":     `apiserver_request_total{verb=PUT} 1`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseRequestCounts(strings.NewReader(line))
			assert.Error(t, err)
		})
	}
}

func TestParseLabelsUnescapes(t *testing.T) {
	l, rest, err := parseLabels(`a="x\"y",b="p\\q"} 5`)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": `x"y`, "b": `p\q`}, l)
	assert.Equal(t, " 5", rest)
}

func TestWritesBetweenCountsOnlyTheGroupsWriteVerbs(t *testing.T) {
	before, err := ParseRequestCounts(strings.NewReader(scrape))
	require.NoError(t, err)
	after := RequestCounts{}
	for k, v := range before {
		after[k] = v
	}
	after[RequestKey{Group: group, Resource: "virtualmachines", Verb: "POST", Code: "201"}] += 5
	after[RequestKey{Group: group, Resource: "virtualmachines", Subresource: "status", Verb: "PUT", Code: "200"}] += 10
	after[RequestKey{Group: group, Resource: "virtualmachines", Verb: "WATCH", Code: "200"}] += 7
	after[RequestKey{Group: group, Resource: "virtualmachines", Verb: "DELETE", Code: "200"}] = 1 // a series that appeared
	after[RequestKey{Resource: "events", Verb: "POST", Code: "201"}] += 100

	w := WritesBetween(before, after, group)
	assert.Equal(t, 16.0, w.Resource("virtualmachines"), "reads and watches are not writes")
	assert.Zero(t, w.Resource("events"), "another group's writes are not counted")
	assert.Equal(t, []RequestCount{
		{Request: "PUT virtualmachines/status 200", Count: 10, PerVM: 2},
		{Request: "POST virtualmachines 201", Count: 5, PerVM: 1},
		{Request: "DELETE virtualmachines 200", Count: 1, PerVM: 0.2},
	}, w.Breakdown(5))
}

func TestOtherRequestsAreEveryRequestNotCountedAsOursAndNotRare(t *testing.T) {
	get := RequestKey{Group: group, Resource: "virtualmachines", Verb: "GET", Code: "200"}
	put := RequestKey{Group: group, Resource: "virtualmachines", Verb: "PUT", Code: "200"}
	secrets := RequestKey{Resource: "secrets", Verb: "GET", Code: "200"}
	rare := RequestKey{Resource: "configmaps", Verb: "LIST", Code: "200"}
	before := RequestCounts{get: 1, put: 1, secrets: 0}
	after := RequestCounts{get: 21, put: 11, secrets: 5, rare: 1}

	ours := WritesBetween(before, after, group)
	assert.Equal(t, []RequestCount{
		{Request: "GET virtualmachines 200", Count: 20, PerVM: 1},
		{Request: "GET secrets 200", Count: 5, PerVM: 0.25},
	}, otherRequests(before, after, ours, 20), "the PUT is ours; one LIST in 20 VMs is below the threshold")
}

func TestUnreplayed(t *testing.T) {
	cases := map[string]struct {
		rows []RequestCount
		want []string
	}{
		"EveryWriteReplayed": {rows: []RequestCount{
			{Request: "POST virtualmachines 201", PerVM: 1},
			{Request: "PATCH volumes 200", PerVM: 1},
			{Request: "PATCH volumes 409", PerVM: 0.6},
			{Request: "POST networkaddresses 201", PerVM: 1},
		}},
		"RareWritesAndReadsIgnored": {rows: []RequestCount{
			{Request: "PUT virtualnetworks/status 200", PerVM: 0.02},
			{Request: "LIST volumes 200", PerVM: 3},
		}},
		"ANewWrite": {
			rows: []RequestCount{{Request: "POST virtualmachines 201", PerVM: 1}, {Request: "PUT diskimages/status 200", PerVM: 0.5}},
			want: []string{"PUT diskimages/status 200 (0.50 per VM)"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, unreplayed(tc.rows))
		})
	}
}
