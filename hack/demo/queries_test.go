package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

// The monitoring queries of config/monitoring, turned into PromQL the demo's Prometheus can run.

// ksmPrefix names the series kube-state-metrics makes from config/monitoring/kube-state-metrics.yaml;
// the demo runs no kube-state-metrics, so queries on them are skipped (and listed).
const ksmPrefix = "kube_subscriptionflow_"

// grafanaVariables are the values the demo's queries use for the dashboard's template variables:
// the demo's namespace, and a rate window of four 1 s scrapes (Grafana's $__rate_interval is at
// least four scrape intervals).
var grafanaVariables = map[string]string{"namespace": namespace, "__rate_interval": "4s", "__interval": "1s"}

// query is one PromQL query to run, and where it comes from.
type query struct {
	where  string
	promQL string
}

// skipped is a query the demo cannot answer: it reads kube-state-metrics series.
type skipped struct {
	query
	metrics []string // the kube-state-metrics series it reads
}

// monitoringQueries returns what must return series in the demo: each dashboard query as a
// whole and each metric selector in it (an `or vector(0)` would hide a missing metric), and each
// metric selector of each alert (alerts return nothing while all is well). A query or selector
// that reads kube-state-metrics series goes to skips instead.
func monitoringQueries(t *testing.T) (checks []query, skips []skipped) {
	t.Helper()
	add := func(q query, whole bool) {
		if ksm := ksmMetrics(q.promQL); whole && len(ksm) > 0 {
			skips = append(skips, skipped{q, ksm})
		} else if whole {
			checks = append(checks, q)
		}
		for _, sel := range metricSelectors(q.promQL) {
			s := query{q.where + ", selector", sel}
			if ksm := ksmMetrics(sel); len(ksm) > 0 {
				skips = append(skips, skipped{s, ksm})
			} else {
				checks = append(checks, s)
			}
		}
	}
	dash, err := dashboardQueries(filepath.Join(testenv.RepoRoot(), "config", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range dash {
		add(q, true)
	}
	alerts, err := ruleQueries(filepath.Join(testenv.RepoRoot(), "config", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range alerts {
		add(q, false)
	}
	return checks, skips
}

type dashboardPanel struct {
	Title   string                  `json:"title"`
	Targets []struct{ Expr string } `json:"targets"`
	Panels  []dashboardPanel        `json:"panels"`
}

// dashboardQueries returns every target expression of every panel (rows included) and every
// label_values() variable query, with the template variables substituted.
func dashboardQueries(path string) ([]query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []query
	var walk func([]dashboardPanel) error
	walk = func(panels []dashboardPanel) error {
		for _, p := range panels {
			for i, target := range p.Targets {
				promQL, err := substituteVariables(target.Expr)
				if err != nil {
					return fmt.Errorf("panel %q: %w", p.Title, err)
				}
				out = append(out, query{fmt.Sprintf("dashboard panel %q target %d", p.Title, i), promQL})
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			return nil, fmt.Errorf("variable %q: cannot turn %q into PromQL", v.Name, v.Definition)
		}
		// label_values(metric, label) lists the label's values on the metric's series.
		out = append(out, query{fmt.Sprintf("dashboard variable %q", v.Name), fmt.Sprintf(`%s{%s!=""}`, m[1], m[2])})
	}
	return out, nil
}

var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// templateVariable matches Grafana's $name, ${name}, ${name:format} and [[name]].
var templateVariable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)`)

// substituteVariables replaces the dashboard's template variables with the demo's values; an
// unknown variable is an error, so that a new variable gets a value here.
func substituteVariables(expr string) (string, error) {
	var unknown []string
	out := templateVariable.ReplaceAllStringFunc(expr, func(v string) string {
		m := templateVariable.FindStringSubmatch(v)
		name := m[1] + m[2] + m[3]
		value, ok := grafanaVariables[name]
		if !ok {
			unknown = append(unknown, v)
		}
		return value
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown template variable %s in %q", strings.Join(unknown, ", "), expr)
	}
	return out, nil
}

// ruleQueries returns the expression of every rule in a PrometheusRule.
func ruleQueries(path string) ([]query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct{ Alert, Record, Expr string }
			}
		}
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []query
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out = append(out, query{"alert " + r.Alert + r.Record, r.Expr})
		}
	}
	return out, nil
}

// promQLToken splits PromQL into what matters for finding selectors, leftmost first: grouping
// clauses (their label lists are not metrics), a name with its label matchers, bare matchers,
// range and subquery brackets, strings, and numbers or durations.
var promQLToken = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)` +
	`|([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\{[^}]*\})?` +
	`|\{[^}]*\}` +
	`|\[[^\]]*\]` +
	"|\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`" +
	`|[0-9][0-9a-zA-Z_.]*`)

var leadingGrouping = regexp.MustCompile(`^\s*(?:by|without)\s*\([^)]*\)`)

var promQLKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "atan2": true}

// metricSelectors returns the metric selectors of expr (name and label matchers, without range
// or offset), in order. Regexp-based, good for our own rules and dashboard, not for all of
// PromQL: a `}` inside a label value, or a metric named like a keyword, would mislead it.
func metricSelectors(expr string) []string {
	var out []string
	for _, m := range promQLToken.FindAllStringSubmatchIndex(expr, -1) {
		if m[2] < 0 { // not a name: a clause, bracket, string or number
			if strings.HasPrefix(expr[m[0]:], "{") {
				out = append(out, expr[m[0]:m[1]])
			}
			continue
		}
		name, matchers := expr[m[2]:m[3]], ""
		if m[4] >= 0 {
			matchers = strings.TrimSpace(expr[m[4]:m[5]])
		}
		// An aggregation may have its clause between name and parenthesis: sum by (le) (...).
		rest := leadingGrouping.ReplaceAllString(expr[m[1]:], "")
		isCall := matchers == "" && strings.HasPrefix(strings.TrimSpace(rest), "(")
		if isCall || promQLKeywords[strings.ToLower(name)] {
			continue
		}
		out = append(out, name+matchers)
	}
	return out
}

// ksmMetrics returns the kube-state-metrics series expr reads.
func ksmMetrics(expr string) []string {
	var out []string
	for _, sel := range metricSelectors(expr) {
		name, _, _ := strings.Cut(sel, "{")
		if strings.HasPrefix(name, ksmPrefix) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// ksmConfigMetrics returns the series names config/monitoring/kube-state-metrics.yaml defines.
func ksmConfigMetrics(path string) (map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Spec struct {
			Resources []struct {
				MetricNamePrefix string `json:"metricNamePrefix"`
				Metrics          []struct{ Name string }
			}
		}
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	names := map[string]bool{}
	for _, r := range cfg.Spec.Resources {
		for _, m := range r.Metrics {
			names[r.MetricNamePrefix+"_"+m.Name] = true
		}
	}
	return names, nil
}

// checkSkips fails unless every skipped query reads only series kube-state-metrics defines:
// a misspelt kube_subscriptionflow_ name must not hide among the skips.
func checkSkips(skips []skipped, defined map[string]bool) error {
	var errs []string
	for _, s := range skips {
		for _, name := range s.metrics {
			if !defined[name] {
				errs = append(errs, fmt.Sprintf("%s: %s is not a kube-state-metrics series of kube-state-metrics.yaml", s.where, name))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

func TestMetricSelectors(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum(subflow_flow_paused{namespace=~"shop"}) or vector(0)`: {`subflow_flow_paused{namespace=~"shop"}`},
		`group by (namespace, name) (kube_subscriptionflow_info) unless on (namespace, name) group by (namespace, name) (subflow_flow_paused)`: {
			"kube_subscriptionflow_info", "subflow_flow_paused"},
		`histogram_quantile(0.99, sum by (le) (rate(subflow_agent_push_duration_seconds_bucket[4s])))`: {
			"subflow_agent_push_duration_seconds_bucket"},
		`time() - (max by (namespace, name) (a{type="Paused"}) * on (namespace, name) max by (namespace, name) (b == 1))`: {
			`a{type="Paused"}`, "b"},
		`x {l=~"[a-z]+", m!="on(y)"} offset 5m > bool 1e3`:               {`x{l=~"[a-z]+", m!="on(y)"}`},
		`sum(rate(x[1m:10s])) without (job) / ignoring(le) group_left y`: {"x", "y"},
		`{__name__="up"} and inf`:                                        {`{__name__="up"}`},
	} {
		if got := metricSelectors(expr); !slices.Equal(got, want) {
			t.Errorf("metricSelectors(%q) = %q, want %q", expr, got, want)
		}
	}
}

func TestSubstituteVariables(t *testing.T) {
	got, err := substituteVariables(`rate(x{namespace=~"$namespace", n=~"${namespace:regex}"}[$__rate_interval]) > [[namespace]]`)
	if want := `rate(x{namespace=~"shop", n=~"shop"}[4s]) > shop`; err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if _, err := substituteVariables(`x{flow="$flow"}`); err == nil || !strings.Contains(err.Error(), "$flow") {
		t.Errorf("an unknown variable gave %v, want an error naming it", err)
	}
}

// TestSkipsAreKubeStateMetricsOnly shows that the skip list holds exactly the queries on
// kube-state-metrics series, and that a misspelt one is caught.
func TestSkipsAreKubeStateMetricsOnly(t *testing.T) {
	checks, skips := monitoringQueries(t)
	defined, err := ksmConfigMetrics(filepath.Join(testenv.RepoRoot(), "config", "monitoring", "kube-state-metrics.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSkips(skips, defined); err != nil {
		t.Error(err)
	}
	if len(skips) == 0 || len(checks) == 0 {
		t.Fatalf("%d checks and %d skips: the dashboard and rules were not read", len(checks), len(skips))
	}
	for _, c := range checks {
		if strings.Contains(c.promQL, ksmPrefix) {
			t.Errorf("%s: %s reads kube-state-metrics series but is checked", c.where, c.promQL)
		}
	}
	typo := skipped{query{"alert X", "kube_subscriptionflow_staus_condition == 1"}, []string{"kube_subscriptionflow_staus_condition"}}
	if err := checkSkips(append(skips, typo), defined); err == nil || !strings.Contains(err.Error(), "staus") {
		t.Errorf("a misspelt kube-state-metrics series was accepted: %v", err)
	}
}
