package config

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"
)

// The PrometheusRule is checked like the dashboard (every metric and label it uses exists) and
// unit-tested with promtool against prometheusrule-test.yaml.

const (
	rulePath     = "monitoring/prometheusrule.yaml"
	ruleTestPath = "monitoring/prometheusrule-test.yaml"
	// ruleFileName is the plain rule file prometheusrule-test.yaml names in rule_files.
	ruleFileName = "subflow-alerts.rules.yaml"
)

// pendingAlertMetrics are metrics alerts already use that the code does not export yet.
// Remove an entry when the metric lands (this test then says so).
var pendingAlertMetrics = map[string][]string{}

type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec ruleFile `json:"spec"`
}

// ruleFile is also the layout of a plain Prometheus rule file, which is what promtool reads.
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string      `json:"name"`
	Interval string      `json:"interval,omitempty"`
	Rules    []alertRule `json:"rules"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ruleTests struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval"`
	Tests              []struct {
		Name        string `json:"name"`
		Interval    string `json:"interval"`
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func TestAlertRules(t *testing.T) {
	rule := loadPrometheusRule(t)
	labels := knownMetricLabels(t)
	reportAll(t, checkPrometheusRule(rule, labels))
	reportAll(t, checkRuleTests(rule, loadRuleTests(t), labels))
	for name := range pendingAlertMetrics {
		if _, defined := goMetricLabels(t)[name]; defined {
			t.Errorf("%s is now defined in %v: remove it from pendingAlertMetrics in alerts_test.go", name, goMetricSources)
		}
	}
}

// TestAlertRulesWithPromtool runs `promtool test rules`: each alert fires exactly where the
// test file expects it and nowhere else.
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool := findPromtool(t)
	dir := writePromtoolInputs(t, loadPrometheusRule(t).Spec)
	runPromtool(t, promtool, dir, "check", "rules", ruleFileName)
	runPromtool(t, promtool, dir, "test", "rules", filepath.Base(ruleTestPath))
}

// TestPromtoolCatchesWrongRules makes sure the promtool run above can fail: without their
// `for:` durations the alerts fire early, where the test file says they must not.
func TestPromtoolCatchesWrongRules(t *testing.T) {
	promtool := findPromtool(t)
	spec := loadPrometheusRule(t).Spec
	for g := range spec.Groups {
		for r := range spec.Groups[g].Rules {
			spec.Groups[g].Rules[r].For = ""
		}
	}
	dir := writePromtoolInputs(t, spec)
	out, err := promtoolCommand(t, promtool, dir, "test", "rules", filepath.Base(ruleTestPath)).CombinedOutput()
	if err == nil {
		t.Fatalf("promtool accepted alerts without their for: durations:\n%s", out)
	}
}

func TestChecksCatchAlertMistakes(t *testing.T) {
	labels := knownMetricLabels(t)
	rule := loadPrometheusRule(t)
	rule.Kind = "PrometheusRules"
	rules := rule.Spec.Groups[0].Rules
	rules[0].Expr = `subflow_flow_pausd == 1`
	rules[1].Expr = `subflow_flow_agents{phase="Unreachable"} > 0`
	rules[2].Labels = nil
	rules[3].Annotations = map[string]string{"summary": "x"}
	rules[4].Alert = rules[5].Alert
	if errs := checkPrometheusRule(rule, labels); len(errs) < 6 {
		t.Errorf("broken rule gave %d errors, want at least 6: %v", len(errs), errs)
	}

	tests := loadRuleTests(t)
	tests.Tests[0].InputSeries[0].Series = `subflow_flow_paused{namespace="shop",nmae="orders"}`
	tests.Tests[1].InputSeries[0].Series = `subflow_agents{namespace="shop"}`
	if errs := checkRuleTests(loadPrometheusRule(t), tests, labels); len(errs) < 2 {
		t.Errorf("broken rule tests gave %d errors, want at least 2: %v", len(errs), errs)
	}
}

func loadPrometheusRule(t *testing.T) prometheusRule {
	t.Helper()
	var rule prometheusRule
	loadStrict(t, rulePath, &rule)
	return rule
}

func loadRuleTests(t *testing.T) ruleTests {
	t.Helper()
	var tests ruleTests
	loadStrict(t, ruleTestPath, &tests)
	return tests
}

// loadStrict refuses unknown fields, so a misspelt key fails here instead of being ignored.
func loadStrict(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

var severities = []string{"warning", "critical"}

func checkPrometheusRule(rule prometheusRule, labels map[string][]string) (errs []error) {
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" || rule.Metadata.Name == "" {
		errs = append(errs, fmt.Errorf("want a named monitoring.coreos.com/v1 PrometheusRule, got %s %s %q", rule.APIVersion, rule.Kind, rule.Metadata.Name))
	}
	seen := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("alert %q", r.Alert)
			if r.Alert == "" || seen[r.Alert] {
				errs = append(errs, fmt.Errorf("%s: every rule needs an alert name of its own", where))
			}
			seen[r.Alert] = true
			if !slices.Contains(severities, r.Labels["severity"]) {
				errs = append(errs, fmt.Errorf("%s: label severity must be one of %v", where, severities))
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				errs = append(errs, fmt.Errorf("%s: needs summary and description annotations", where))
			}
			errs = append(errs, checkSelectors(where, r.Expr, labels)...)
		}
	}
	return errs
}

// checkSelectors checks that every metric an expression selects exists, with the labels its
// matchers name.
func checkSelectors(where, expr string, labels map[string][]string) (errs []error) {
	for _, name := range promQLMetricNames(expr) {
		if _, ok := labels[name]; !ok {
			errs = append(errs, fmt.Errorf("%s: metric %s is defined neither in %v nor in %s nor in pendingAlertMetrics", where, name, goMetricSources, ksmConfigPath))
		}
	}
	for _, m := range promQLSelector.FindAllStringSubmatch(expr, -1) {
		known, ok := labels[m[1]]
		if !ok || known == nil {
			continue
		}
		for _, label := range matcherLabels(m[2]) {
			if !slices.Contains(known, label) {
				errs = append(errs, fmt.Errorf("%s: %s has no label %q (labels: %v)", where, m[1], label, known))
			}
		}
	}
	return errs
}

// checkRuleTests checks that the test series are real metrics with real labels, and that every
// alert has a case where it fires and a case where it must not.
func checkRuleTests(rule prometheusRule, tests ruleTests, labels map[string][]string) (errs []error) {
	if !slices.Equal(tests.RuleFiles, []string{ruleFileName}) {
		errs = append(errs, fmt.Errorf("%s: rule_files must be [%s]", ruleTestPath, ruleFileName))
	}
	// A test series may carry what a scrape adds: the target's labels.
	scraped := map[string][]string{}
	for name, known := range labels {
		if known != nil {
			known = append(slices.Clone(known), scrapeLabels...)
		}
		scraped[name] = known
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			errs = append(errs, checkSelectors(fmt.Sprintf("%s: test %q series", ruleTestPath, tc.Name), s.Series, scraped)...)
		}
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] || !silent[r.Alert] {
				errs = append(errs, fmt.Errorf("%s: alert %s needs a case where it fires and one where it must not (fires: %v, silent: %v)",
					ruleTestPath, r.Alert, fires[r.Alert], silent[r.Alert]))
			}
		}
	}
	return errs
}

// scrapeLabels are the labels a ServiceMonitor or PodMonitor adds to every series of its targets
// (with honorLabels, a series' own namespace is kept; the target's is used only where the series
// has none).
var scrapeLabels = []string{"job", "namespace", "pod", "service", "endpoint", "instance", "container"}

var (
	promQLSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherLabel   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

func matcherLabels(matchers string) []string {
	var names []string
	for _, m := range matcherLabel.FindAllStringSubmatch(promQLStrings.ReplaceAllString(matchers, `""`), -1) {
		names = append(names, m[1])
	}
	return names
}

// knownMetricLabels maps every metric the code, kube-state-metrics or pendingAlertMetrics
// defines to its label names.
func knownMetricLabels(t *testing.T) map[string][]string {
	t.Helper()
	labels := goMetricLabels(t)
	maps.Copy(labels, ksmMetricLabels(loadKSMConfig(t, ksmConfigPath)))
	maps.Copy(labels, pendingAlertMetrics)
	return labels
}

var (
	goMetricConstructor = regexp.MustCompile(`prometheus\.New(\w+)\(`)
	goMetricLabelList   = regexp.MustCompile(`\},\s*\[\]string\{([^}]*)\}\s*\)`)
	goQuoted            = regexp.MustCompile(`"([^"]*)"`)
)

// goMetricLabels reads each prometheus.New...(Opts{Name: ...}, labels) definition. A vector
// whose labels are not a []string literal gets nil: its labels are not checked.
func goMetricLabels(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, path := range goMetricSources {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		found := goMetricConstructor.FindAllStringSubmatchIndex(string(src), -1)
		for i, loc := range found {
			end := len(src)
			if i+1 < len(found) {
				end = found[i+1][0]
			}
			def := string(src[loc[0]:end])
			m := goMetricOpts.FindStringSubmatch(def)
			if m == nil {
				continue
			}
			names := []string{}
			if strings.HasSuffix(string(src[loc[2]:loc[3]]), "Vec") {
				names = nil
				if l := goMetricLabelList.FindStringSubmatch(def); l != nil {
					names = []string{}
					for _, q := range goQuoted.FindAllStringSubmatch(l[1], -1) {
						names = append(names, q[1])
					}
				}
			}
			for _, suffix := range seriesSuffixes[m[1]] {
				out[m[2]+suffix] = names
			}
			if m[1] == "Histogram" && names != nil {
				out[m[2]+"_bucket"] = append(slices.Clone(names), "le")
			}
		}
	}
	return out
}

// ksmMetricLabels gives each kube-state-metrics series its labels: the resource's, the
// metric's, the each-block's labelsFromPath and a StateSet's labelName.
func ksmMetricLabels(cfg ksmConfig) map[string][]string {
	out := map[string][]string{}
	for _, r := range cfg.Spec.Resources {
		prefix := ksmDefaultName
		if r.MetricNamePrefix != nil {
			prefix = *r.MetricNamePrefix
		}
		for _, m := range r.Metrics {
			names := slices.Collect(maps.Keys(r.LabelsFromPath))
			names = append(names, slices.Collect(maps.Keys(m.LabelsFromPath))...)
			for _, each := range []*ksmEachSpec{m.Each.Gauge, m.Each.StateSet, m.Each.Info} {
				if each == nil {
					continue
				}
				names = append(names, slices.Collect(maps.Keys(each.LabelsFromPath))...)
				if each.LabelName != "" {
					names = append(names, each.LabelName)
				}
			}
			out[strings.TrimPrefix(prefix+"_"+m.Name, "_")] = names
		}
	}
	return out
}

// findPromtool returns promtool's path. `make test` must pass on a machine with only Go, so
// without promtool these tests skip and say how to run them; CI installs it (Debian's
// prometheus package) and sets SUBFLOW_REQUIRE_PROMTOOL=1, so that there they cannot skip.
func findPromtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("SUBFLOW_REQUIRE_PROMTOOL") == "1" {
		t.Fatal("promtool not on PATH and SUBFLOW_REQUIRE_PROMTOOL=1: install it (Debian/Ubuntu: apt-get install -y prometheus)")
	}
	t.Skip("promtool not on PATH: the alert rules are not unit-tested here (Debian/Ubuntu: apt-get install -y prometheus)")
	return ""
}

// writePromtoolInputs writes the rules as a plain rule file next to a copy of the test file.
func writePromtoolInputs(t *testing.T, spec ruleFile) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(ruleTestPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{ruleFileName: rules, filepath.Base(ruleTestPath): tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func promtoolCommand(t *testing.T, promtool, dir string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, promtool, args...)
	cmd.Dir = dir
	return cmd
}

func runPromtool(t *testing.T, promtool, dir string, args ...string) {
	t.Helper()
	out, err := promtoolCommand(t, promtool, dir, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// runbookBase is where docs/troubleshooting.md is read on the project's repository.
const (
	troubleshootingPath = "../docs/troubleshooting.md"
	runbookBase         = "https://github.com/subflow-dev/subflow/blob/main/docs/troubleshooting.md"
)

// TestAlertRunbooks: every alert's runbook_url opens a section of docs/troubleshooting.md.
func TestAlertRunbooks(t *testing.T) {
	doc, err := os.ReadFile(troubleshootingPath)
	if err != nil {
		t.Fatal(err)
	}
	reportAll(t, checkRunbooks(loadPrometheusRule(t), string(doc)))

	broken := loadPrometheusRule(t)
	broken.Spec.Groups[0].Rules[0].Annotations["runbook_url"] = runbookBase + "#no-such-section"
	delete(broken.Spec.Groups[0].Rules[1].Annotations, "runbook_url")
	broken.Spec.Groups[0].Rules[2].Annotations["runbook_url"] = strings.Replace(broken.Spec.Groups[0].Rules[2].Annotations["runbook_url"], "/main/", "/master/", 1)
	if errs := checkRunbooks(broken, string(doc)); len(errs) != 3 {
		t.Errorf("broken runbook URLs gave %d errors, want 3: %v", len(errs), errs)
	}
}

func checkRunbooks(rule prometheusRule, doc string) (errs []error) {
	anchors := markdownAnchors(doc)
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			url := r.Annotations["runbook_url"]
			base, anchor, _ := strings.Cut(url, "#")
			switch {
			case base != runbookBase:
				errs = append(errs, fmt.Errorf("alert %s: runbook_url %q, want %s#<section>", r.Alert, url, runbookBase))
			case !anchors[anchor]:
				errs = append(errs, fmt.Errorf("alert %s: runbook_url %q names no heading of docs/troubleshooting.md", r.Alert, url))
			}
		}
	}
	return errs
}

var markdownHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)

// markdownAnchors are the fragments GitHub gives a document's headings: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		m := markdownHeading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.ReplaceAll(m[1], "`", "")) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}
