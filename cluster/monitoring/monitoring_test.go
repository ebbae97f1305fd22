// Package monitoring_test checks cluster/monitoring against the metrics
// virtfleet declares (internal/metrics) and against promtool. Every metric
// the dashboard and the alert rules name must be one virtfleet exports (a
// histogram only through its _bucket, _sum and _count series). promtool must
// accept the rules and pass their tests, which must fire every alert. The
// README must list every metric with its type and labels and have a
// runbook section for every alert, which the alert's runbook_url links to.
package monitoring_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

const (
	dashboardFile = "dashboard.json"
	rulesFile     = "alerts.yaml"
	rulesTestFile = "alerts_test.yaml"
	readmeFile    = "README.md"

	// runbookPrefix is where every alert's runbook_url points, followed by
	// the anchor of the alert's section in README.md.
	runbookPrefix = "https://github.com/virtfleet/virtfleet/blob/main/cluster/monitoring/README.md#"
	// datasourceUID is how every panel names its data source: the
	// dashboard's variable of type datasource.
	datasourceUID = "${datasource}"
)

// requiredAlerts are the alerts the runbook promises.
var requiredAlerts = []string{
	"VirtfleetHubDown",
	"VirtfleetNodeLost",
	"VirtfleetAgentNotReporting",
	"VirtfleetVMsFailed",
	"VirtfleetPlacementRefusing",
	"VirtfleetImageImportFailing",
	"VirtfleetReportsIgnored",
	"VirtfleetBackupsFailing",
	"VirtfleetBackupCorrupt",
	"VirtfleetBucketNearlyFull",
}

// otherMetrics are the metrics not virtfleet's that a query may name:
// Prometheus's own, per target.
var otherMetrics = map[string]bool{"up": true}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = map[string]bool{"job": true, "instance": true}

var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// The metrics internal/metrics declares.

// metric is what the README's table says of a metric.
type metric struct {
	Type   string // counter, gauge or histogram
	Labels []string
}

// scraped are the hub's gauges computed when scraped, which are
// descriptors rather than collectors.
var scraped = []*prometheus.Desc{
	metrics.VMs, metrics.DiskImages, metrics.VMSnapshots, metrics.VMBackups, metrics.NodeCapacity, metrics.NodeAllocated,
	metrics.NodeVMs, metrics.NodeReady, metrics.NodeLastHeartbeat,
	metrics.BucketBytes, metrics.BucketMaxBytes, metrics.BucketValues,
	metrics.NodeReportValues, metrics.NodeReportMaxValues, metrics.NodeReportBytes, metrics.NodeReportMaxBytes,
}

// declared are the metrics internal/metrics declares, by name, with their
// type and labels; exactly metrics.Names().
func declared(t *testing.T) map[string]metric {
	t.Helper()
	out := map[string]metric{}
	for _, d := range scraped {
		name, labels := descInfo(t, d)
		out[name] = metric{Type: "gauge", Labels: labels}
	}
	for _, c := range append(metrics.HubObserved(), metrics.DefaultAgent().Collectors()...) {
		var typ string
		switch c.(type) {
		case *prometheus.CounterVec:
			typ = "counter"
		case *prometheus.GaugeVec:
			typ = "gauge"
		case *prometheus.HistogramVec:
			typ = "histogram"
		default:
			t.Fatalf("collector %T: add its type to declared", c)
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			name, labels := descInfo(t, d)
			out[name] = metric{Type: typ, Labels: labels}
		}
	}
	require.ElementsMatch(t, metrics.Names(), slices.Collect(maps.Keys(out)),
		"the metrics of internal/metrics this test finds (scraped, HubObserved, Agent) differ from metrics.Names(): add the new ones to scraped")
	return out
}

// descString is what prometheus.Desc.String says of a descriptor.
var descString = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: .*, variableLabels: \{([^{}]*)\}\}$`)

// descInfo is the name and variable labels of d.
func descInfo(t *testing.T, d *prometheus.Desc) (string, []string) {
	t.Helper()
	m := descString.FindStringSubmatch(d.String())
	require.NotNil(t, m, "cannot read the name and labels of %s", d)
	name, err := strconv.Unquote(m[1])
	require.NoError(t, err)
	var labels []string
	for l := range strings.SplitSeq(m[2], ",") {
		if l != "" {
			labels = append(labels, l)
		}
	}
	return name, labels
}

// PromQL, as far as naming metrics goes.

var (
	promString   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\[\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// promToken is a Grafana variable, a number or duration, or an
	// identifier, with the parenthesis that makes it a function call.
	promToken       = regexp.MustCompile(`\$\{[^}]*\}|\$\w+|[0-9][\w.]*|[A-Za-z_:][\w:]*(?:\s*\()?`)
	virtfleetIdent  = regexp.MustCompile(`\bvirtfleet_[\w:]*`)
	grafanaVariable = regexp.MustCompile(`\$\{(\w+)[^}]*\}|\$(\w+)`)
	labelValues     = regexp.MustCompile(`^\s*label_values\((.+),\s*(\w+)\s*\)\s*$`)
)

// promKeywords are the identifiers of PromQL that are no metric.
var promKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "bool": true, "inf": true, "nan": true,
}

// metricsIn are the metric names a PromQL expression selects.
func metricsIn(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, "{}")
	s = promRange.ReplaceAllString(s, "[]")
	s = promGrouping.ReplaceAllString(s, " ")
	var out []string
	for _, tok := range promToken.FindAllString(s, -1) {
		if strings.HasPrefix(tok, "$") || unicode.IsDigit(rune(tok[0])) || strings.HasSuffix(tok, "(") || promKeywords[strings.ToLower(tok)] {
			continue
		}
		if !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

// exprProblems says what is wrong with the metrics expr names: none at all,
// or one virtfleet does not export.
func exprProblems(expr string, known map[string]metric) []string {
	names := metricsIn(expr)
	if len(names) == 0 {
		return []string{"names no metric"}
	}
	// Every virtfleet_ identifier, wherever it stands, outside strings.
	for _, n := range virtfleetIdent.FindAllString(promString.ReplaceAllString(expr, `""`), -1) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	var out []string
	for _, n := range names {
		if p := seriesProblem(n, known); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// seriesProblem says why no series is named name, or "".
func seriesProblem(name string, known map[string]metric) string {
	if otherMetrics[name] {
		return ""
	}
	if m, ok := known[name]; ok {
		if m.Type == "histogram" {
			return fmt.Sprintf("%s is a histogram: its series are %[1]s_bucket, %[1]s_sum and %[1]s_count", name)
		}
		return ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && known[base].Type == "histogram" {
			return ""
		}
	}
	return fmt.Sprintf("%s is no metric virtfleet exports (internal/metrics)", name)
}

// baseMetric is the metric a series name belongs to.
func baseMetric(name string, known map[string]metric) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && known[base].Type == "histogram" {
			return base
		}
	}
	return name
}

func TestExprProblems(t *testing.T) {
	known := declared(t)
	for _, tc := range []struct {
		expr     string
		metrics  []string
		problems int
	}{
		{`sum by (phase) (max by (phase, backend) (virtfleet_hub_vms))`, []string{"virtfleet_hub_vms"}, 0},
		{`histogram_quantile(0.95, sum by (le) (rate(virtfleet_hub_placement_duration_seconds_bucket[$__rate_interval])))`, []string{"virtfleet_hub_placement_duration_seconds_bucket"}, 0},
		{`count(max by (node) (virtfleet_hub_node_ready{node=~"$node"}) == 0) or vector(0)`, []string{"virtfleet_hub_node_ready"}, 0},
		{`up{job="virtfleet-hub"} == 0 unless on (job) up offset 5m`, []string{"up"}, 0},
		{`sum(rate(virtfleet_agent_resync_duration_seconds_sum[5m])) / sum(rate(virtfleet_agent_resync_duration_seconds_count[5m]))`, []string{"virtfleet_agent_resync_duration_seconds_sum", "virtfleet_agent_resync_duration_seconds_count"}, 0},
		// A label value is no metric.
		{`up{job="virtfleet_nothing"}`, []string{"up"}, 0},
		// A typo, inside and outside virtfleet's prefix.
		{`max by (phase) (virtfleet_hub_vm{phase="Failed"})`, []string{"virtfleet_hub_vm"}, 1},
		{`max by (phase) (virtfeet_hub_vms)`, []string{"virtfeet_hub_vms"}, 1},
		// A histogram has no series of its own name; a counter has no _count.
		{`rate(virtfleet_hub_placement_duration_seconds[5m])`, []string{"virtfleet_hub_placement_duration_seconds"}, 1},
		{`rate(virtfleet_hub_placement_refusals_total_count[5m])`, []string{"virtfleet_hub_placement_refusals_total_count"}, 1},
		// No metric at all.
		{`vector(1)`, nil, 1},
		{``, nil, 1},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			assert.Equal(t, tc.metrics, metricsIn(tc.expr))
			assert.Len(t, exprProblems(tc.expr, known), tc.problems, "%q", exprProblems(tc.expr, known))
		})
	}
}

// promtool

// promtool is the path of promtool, or skips the test.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH: run `make deps`, which installs Debian's prometheus package")
	}
	return p
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestPromtoolCheckRules(t *testing.T) {
	runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", rulesFile)
}

func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, "test", "rules", rulesTestFile)
}

// TestDashboardQueriesParse has promtool parse every query of the
// dashboard, as recording rules, with Grafana's variables filled in.
func TestDashboardQueriesParse(t *testing.T) {
	bin := promtool(t)
	var rules []rule
	for _, p := range allPanels(readDashboard(t).Panels) {
		for _, tg := range p.Targets {
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel_%d_%s", p.ID, tg.RefID), Expr: grafanaVariable.ReplaceAllStringFunc(tg.Expr, fillVariable)})
		}
	}
	require.NotEmpty(t, rules)
	b, err := yaml.Marshal(ruleFile{Groups: []ruleGroup{{Name: "dashboard", Rules: rules}}})
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	out, err := exec.Command(bin, "check", "rules", f).CombinedOutput()
	require.NoError(t, err, "promtool check rules on the dashboard's queries:\n%s\n%s", out, b)
}

// fillVariable is a value for a Grafana variable in a query: a range for
// Grafana's interval variables, a regexp matching anything for the
// dashboard's own.
func fillVariable(v string) string {
	switch strings.Trim(v, "${}") {
	case "__rate_interval", "__interval", "__range":
		return "5m"
	case "__range_s", "__interval_ms":
		return "300"
	}
	return ".*"
}

// The dashboard.

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Datasource *datasourceRef  `json:"datasource"`
	Definition string          `json:"definition"`
	Query      json.RawMessage `json:"query"`
}

// query is the variable's query: a string, or an object with one (the
// Prometheus query editor's).
func (v variable) query(t *testing.T) string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	require.NoError(t, json.Unmarshal(v.Query, &q), "variable %s: query", v.Name)
	return q.Query
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Collapsed  bool           `json:"collapsed"`
	Datasource *datasourceRef `json:"datasource"`
	GridPos    struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	// Panels are a collapsed row's.
	Panels []panel `json:"panels"`
}

type target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	return d
}

// allPanels are ps and the panels of its rows, in order.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func TestDashboard(t *testing.T) {
	known := declared(t)
	d := readDashboard(t)
	assert.NotEmpty(t, d.UID)
	assert.NotEmpty(t, d.Title)
	assert.GreaterOrEqual(t, d.SchemaVersion, 36)

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	require.Contains(t, vars, "datasource")
	assert.Equal(t, "datasource", vars["datasource"].Type)
	assert.Equal(t, "prometheus", vars["datasource"].query(t))
	require.Contains(t, vars, "node")
	assert.Equal(t, "label_values(virtfleet_hub_node_ready, node)", vars["node"].query(t))
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		assert.Equal(t, &datasourceRef{Type: "prometheus", UID: datasourceUID}, v.Datasource, "variable %s", v.Name)
		q := v.query(t)
		m := labelValues.FindStringSubmatch(q)
		if !assert.NotNil(t, m, "variable %s: %q is no label_values(metric, label)", v.Name, q) {
			continue
		}
		assert.Empty(t, exprProblems(m[1], known), "variable %s: %s", v.Name, q)
		for _, n := range metricsIn(m[1]) {
			labels := known[baseMetric(n, known)].Labels
			assert.True(t, targetLabels[m[2]] || slices.Contains(labels, m[2]), "variable %s: %s has no label %s", v.Name, n, m[2])
		}
	}

	ids := map[int]string{}
	shown := map[string]bool{}
	for i, p := range d.Panels {
		if p.Type == "row" && !p.Collapsed {
			assert.Empty(t, p.Panels, "row %q is expanded: its panels follow it, not in it", p.Title)
		}
		if p.Type != "row" {
			assert.NotZero(t, i, "panel %q: the dashboard starts with a row", p.Title)
		}
	}
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		assert.NotZero(t, p.ID, where)
		assert.NotContains(t, ids, p.ID, "%s: id already used by %q", where, ids[p.ID])
		ids[p.ID] = p.Title
		assert.NotEmpty(t, p.Title, where)
		assert.Positive(t, p.GridPos.W, where)
		assert.Positive(t, p.GridPos.H, where)
		assert.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, where)
		if p.Type == "row" {
			assert.Empty(t, p.Targets, where)
			continue
		}
		assert.Equal(t, &datasourceRef{Type: "prometheus", UID: datasourceUID}, p.Datasource, where)
		assert.NotEmpty(t, p.Targets, "%s has no query", where)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			assert.NotEmpty(t, tg.RefID, where)
			assert.False(t, refs[tg.RefID], "%s: refId %s twice", where, tg.RefID)
			refs[tg.RefID] = true
			if tg.Datasource != nil {
				assert.Equal(t, datasourceUID, tg.Datasource.UID, where)
			}
			assert.Empty(t, exprProblems(tg.Expr, known), "%s, query %s: %s", where, tg.RefID, tg.Expr)
			for _, n := range metricsIn(tg.Expr) {
				shown[baseMetric(n, known)] = true
			}
		}
	}
	for _, n := range metrics.Names() {
		assert.True(t, shown[n], "no panel of the dashboard shows %s", n)
	}
}

// The alert rules.

type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var f ruleFile
	require.NoError(t, yaml.UnmarshalStrict(b, &f), "%s", rulesFile)
	require.NotEmpty(t, f.Groups)
	return f
}

// alerts are the alerting rules of f by name.
func alerts(t *testing.T, f ruleFile) map[string]rule {
	t.Helper()
	out := map[string]rule{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if _, dup := out[r.Alert]; dup {
				t.Fatalf("%s: alert %s is defined twice", rulesFile, r.Alert)
			}
			out[r.Alert] = r
		}
	}
	return out
}

func TestAlertRules(t *testing.T) {
	known := declared(t)
	f := readRules(t)
	as := alerts(t, f)
	for _, name := range requiredAlerts {
		assert.Contains(t, slices.Sorted(maps.Keys(as)), name, "%s has no alert %s", rulesFile, name)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			where := r.Alert + r.Record
			assert.Empty(t, exprProblems(r.Expr, known), "%s: %s", where, r.Expr)
			if r.Alert == "" {
				continue
			}
			assert.True(t, severities[r.Labels["severity"]], "%s: severity %q is none of %v", where, r.Labels["severity"], slices.Sorted(maps.Keys(severities)))
			assert.NotEmpty(t, r.Annotations["summary"], "%s: summary", where)
			assert.NotEmpty(t, r.Annotations["description"], "%s: description", where)
			assert.Equal(t, runbookPrefix+githubAnchor(r.Alert), r.Annotations["runbook_url"], "%s: runbook_url", where)
		}
	}
}

// rulesTest is what this test reads of a promtool rule test file.
type rulesTest struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			EvalTime  string            `json:"eval_time"`
			Alertname string            `json:"alertname"`
			ExpAlerts []json.RawMessage `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertsTested checks that alerts_test.yaml fires every alert, and
// shows at least two quiet.
func TestAlertsTested(t *testing.T) {
	as := alerts(t, readRules(t))
	b, err := os.ReadFile(rulesTestFile)
	require.NoError(t, err)
	var rt rulesTest
	require.NoError(t, yaml.Unmarshal(b, &rt))
	assert.Equal(t, []string{rulesFile}, rt.RuleFiles)
	fired, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			_, ok := as[a.Alertname]
			assert.True(t, ok, "%s tests %s, which %s does not have", rulesTestFile, a.Alertname, rulesFile)
			if len(a.ExpAlerts) > 0 {
				fired[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for name := range as {
		assert.True(t, fired[name], "%s never fires %s", rulesTestFile, name)
	}
	assert.GreaterOrEqual(t, len(quiet), 2, "%s shows fewer than two alerts not firing", rulesTestFile)
}

// The README.

func readREADME(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(readmeFile)
	require.NoError(t, err)
	return string(b)
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// without punctuation, spaces made hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestGithubAnchor(t *testing.T) {
	for heading, anchor := range map[string]string{
		"VirtfleetNodeLost":                     "virtfleetnodelost",
		"Prometheus Operator":                   "prometheus-operator",
		"A real guest: `make run GUESTS=qemu`":  "a-real-guest-make-run-guestsqemu",
		"Hub: reports from NATS and the API":    "hub-reports-from-nats-and-the-api",
		"Orphan, adopt, import":                 "orphan-adopt-import",
		"Tenants: what a namespace may reach  ": "tenants-what-a-namespace-may-reach",
	} {
		assert.Equal(t, anchor, githubAnchor(heading), heading)
	}
}

var (
	mdHeading  = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*$`)
	mdFence    = regexp.MustCompile("^\\s*```")
	mdLink     = regexp.MustCompile(`\]\(#([^)]+)\)`)
	metricsRow = regexp.MustCompile("^\\|\\s*`(\\w+)`\\s*\\|\\s*(\\w+)\\s*\\|([^|]*)\\|")
)

// headings are the README's headings outside code blocks, in order, with
// their level.
type heading struct {
	level int
	text  string
}

func headings(readme string) []heading {
	var out []heading
	inCode := false
	for line := range strings.SplitSeq(readme, "\n") {
		if mdFence.MatchString(line) {
			inCode = !inCode
			continue
		}
		if m := mdHeading.FindStringSubmatch(line); m != nil && !inCode {
			out = append(out, heading{level: len(m[1]), text: m[2]})
		}
	}
	return out
}

func TestREADMERunbook(t *testing.T) {
	readme := readREADME(t)
	as := alerts(t, readRules(t))
	anchors := map[string]bool{}
	var runbooks []string
	inRunbook := false
	for _, h := range headings(readme) {
		anchors[githubAnchor(h.text)] = true
		switch {
		case h.level <= 2:
			inRunbook = h.level == 2 && h.text == "Runbook"
		case h.level == 3 && inRunbook:
			runbooks = append(runbooks, h.text)
		}
	}
	assert.ElementsMatch(t, slices.Collect(maps.Keys(as)), runbooks, "the sections of ## Runbook in %s are not one per alert of %s", readmeFile, rulesFile)
	for name, r := range as {
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookPrefix)
		if assert.True(t, ok, "%s: runbook_url %q is not in %s", name, r.Annotations["runbook_url"], runbookPrefix) {
			assert.True(t, anchors[anchor], "%s: runbook_url's #%s is no heading of %s", name, anchor, readmeFile)
		}
	}
	for _, m := range mdLink.FindAllStringSubmatch(readme, -1) {
		assert.True(t, anchors[m[1]], "%s links to #%s, which is no heading", readmeFile, m[1])
	}
}

func TestREADMEMetrics(t *testing.T) {
	known := declared(t)
	readme := readREADME(t)
	rows := map[string]metric{}
	for line := range strings.SplitSeq(readme, "\n") {
		m := metricsRow.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(m[1], "virtfleet_") {
			continue
		}
		assert.NotContains(t, rows, m[1], "%s has two rows for %s", readmeFile, m[1])
		var labels []string
		for l := range strings.SplitSeq(m[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" && l != "—" {
				labels = append(labels, l)
			}
		}
		rows[m[1]] = metric{Type: m[2], Labels: labels}
	}
	for name, want := range known {
		assert.True(t, strings.Contains(readme, "`"+name+"`"), "%s does not mention %s", readmeFile, name)
		if got, ok := rows[name]; assert.True(t, ok, "the Metrics table of %s has no row for %s", readmeFile, name) {
			assert.Equal(t, want, got, "the Metrics table's row for %s (type, labels)", name)
		}
	}
	for name := range rows {
		assert.Contains(t, known, name, "the Metrics table of %s lists %s, which internal/metrics does not declare", readmeFile, name)
	}
}

// TestPrometheusRuleOneLiner runs the README's command that wraps the rules
// in a PrometheusRule, up to kubectl, and checks that its spec is the rule
// file.
func TestPrometheusRuleOneLiner(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on PATH")
	}
	var cmd string
	for line := range strings.SplitSeq(readREADME(t), "\n") {
		if strings.Contains(line, "kind: PrometheusRule") {
			require.Empty(t, cmd, "%s has two commands making a PrometheusRule", readmeFile)
			cmd = strings.TrimSpace(line)
		}
	}
	require.NotEmpty(t, cmd, "%s has no command making a PrometheusRule", readmeFile)
	cmd, ok := strings.CutSuffix(cmd, "| kubectl apply -f -")
	require.True(t, ok, "the PrometheusRule command does not end in | kubectl apply -f -: %s", cmd)

	c := exec.Command(bash, "-c", cmd)
	c.Dir = filepath.Join("..", "..") // run from the repository's root, as the README says
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	require.NoError(t, err, "%s\n%s", cmd, stderr.String())

	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec map[string]any `json:"spec"`
	}
	require.NoError(t, yaml.UnmarshalStrict(out, &pr), "%s", out)
	assert.Equal(t, "monitoring.coreos.com/v1", pr.APIVersion)
	assert.Equal(t, "PrometheusRule", pr.Kind)
	assert.NotEmpty(t, pr.Metadata.Name)
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules map[string]any
	require.NoError(t, yaml.Unmarshal(b, &rules))
	assert.Equal(t, rules, pr.Spec)
}
