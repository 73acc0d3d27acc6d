package config

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// The dashboard and the kube-state-metrics config are checked against the code: a renamed
// metric or status field must fail here rather than leave an empty panel in production.

const (
	ksmConfigPath  = "monitoring/kube-state-metrics.yaml"
	ksmRBACPath    = "monitoring/kube-state-metrics-rbac.yaml"
	dashboardPath  = "monitoring/grafana-dashboard.json"
	ksmDefaultName = "kube_customresource" // kube-state-metrics' prefix when metricNamePrefix is unset
)

// goMetricSources define the controller's and the agent's Prometheus metrics.
var goMetricSources = []string{"../controllers/metrics.go", "../agent/metrics.go"}

// ksmConfig mirrors the kube-state-metrics CustomResourceStateMetrics fields we may use; it is
// decoded strictly so that a misspelt field fails instead of being ignored by kube-state-metrics.
type ksmConfig struct {
	Kind string `json:"kind"`
	Spec struct {
		Resources []ksmResource `json:"resources"`
	} `json:"spec"`
}

type ksmResource struct {
	GroupVersionKind struct {
		Group   string `json:"group"`
		Version string `json:"version"`
		Kind    string `json:"kind"`
	} `json:"groupVersionKind"`
	MetricNamePrefix *string             `json:"metricNamePrefix"`
	ResourcePlural   string              `json:"resourcePlural"`
	CommonLabels     map[string]string   `json:"commonLabels"`
	LabelsFromPath   map[string][]string `json:"labelsFromPath"`
	Metrics          []ksmMetric         `json:"metrics"`
	ErrorLogV        int                 `json:"errorLogV"`
}

type ksmMetric struct {
	Name           string              `json:"name"`
	Help           string              `json:"help"`
	CommonLabels   map[string]string   `json:"commonLabels"`
	LabelsFromPath map[string][]string `json:"labelsFromPath"`
	ErrorLogV      int                 `json:"errorLogV"`
	Each           struct {
		Type     string       `json:"type"`
		Gauge    *ksmEachSpec `json:"gauge"`
		StateSet *ksmEachSpec `json:"stateSet"`
		Info     *ksmEachSpec `json:"info"`
	} `json:"each"`
}

// ksmEachSpec is the union of the gauge, stateSet and info fields.
type ksmEachSpec struct {
	Path           []string            `json:"path"`
	LabelsFromPath map[string][]string `json:"labelsFromPath"`
	ValueFrom      []string            `json:"valueFrom"`
	LabelFromKey   string              `json:"labelFromKey"`
	NilIsZero      bool                `json:"nilIsZero"`
	List           []string            `json:"list"`
	LabelName      string              `json:"labelName"`
}

type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type templateVar struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"`
	Definition string `json:"definition"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []target       `json:"targets"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

func TestKubeStateMetricsConfig(t *testing.T) {
	cfg := loadKSMConfig(t, ksmConfigPath)
	reportAll(t, checkKSMConfig(cfg))
}

func TestKubeStateMetricsRBAC(t *testing.T) {
	data, err := os.ReadFile(ksmRBACPath)
	if err != nil {
		t.Fatal(err)
	}
	var role struct {
		Kind  string `json:"kind"`
		Rules []struct {
			APIGroups []string `json:"apiGroups"`
			Resources []string `json:"resources"`
			Verbs     []string `json:"verbs"`
		} `json:"rules"`
	}
	// The ClusterRole comes first; the binding follows after "---".
	if err := yaml.Unmarshal([]byte(strings.Split(string(data), "\n---")[0]), &role); err != nil {
		t.Fatal(err)
	}
	if role.Kind != "ClusterRole" {
		t.Fatalf("first document is %q, want ClusterRole", role.Kind)
	}
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, subflowv1.GroupVersion.Group) && slices.Contains(r.Resources, "subscriptionflows") &&
			slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") {
			return
		}
	}
	t.Error("ClusterRole does not grant list and watch on subscriptionflows.subflow.dev")
}

func TestGrafanaDashboard(t *testing.T) {
	d := loadDashboard(t, dashboardPath)
	known := goMetricNames(t)
	for name := range ksmMetricNames(loadKSMConfig(t, ksmConfigPath)) {
		known[name] = true
	}
	reportAll(t, checkDashboard(d, known))
}

// TestChecksCatchMistakes makes sure the checks above can fail.
func TestChecksCatchMistakes(t *testing.T) {
	cfg := loadKSMConfig(t, ksmConfigPath)
	cfg.Spec.Resources[0].Metrics[0].Each.Type = "Counter"
	cfg.Spec.Resources[0].Metrics[1].Name = ""
	cfg.Spec.Resources[0].LabelsFromPath["name"] = []string{"metadata", "nmae"}
	if errs := checkKSMConfig(cfg); len(errs) < 3 {
		t.Errorf("broken kube-state-metrics config gave %d errors, want at least 3: %v", len(errs), errs)
	}

	for _, typo := range []string{"valuefrom", "valueFom"} {
		doc := "kind: CustomResourceStateMetrics\nspec:\n  resources:\n  - metrics:\n    - name: x\n      each:\n        type: Gauge\n        gauge:\n          " + typo + ": [status]\n"
		if _, err := decodeKSMConfig([]byte(doc)); err == nil {
			t.Errorf("misspelt field %s was accepted", typo)
		}
	}

	d := loadDashboard(t, dashboardPath)
	d.Panels[0].Targets[0].Expr = "sum(subflow_flow_pausd)"
	d.Panels[1].Datasource = nil
	d.Panels[2].Title = ""
	d.Panels[3].Targets = nil
	if errs := checkDashboard(d, goMetricNames(t)); len(errs) < 4 {
		t.Errorf("broken dashboard gave %d errors, want at least 4: %v", len(errs), errs)
	}
}

func TestPromQLMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum(subflow_flow_paused{namespace=~"$namespace"}) or vector(0)`, []string{"subflow_flow_paused"}},
		{`sum by (state) (subflow_flow_agents)`, []string{"subflow_flow_agents"}},
		{`histogram_quantile(0.99, sum by (le) (rate(a_bucket[$__rate_interval])))`, []string{"a_bucket"}},
		{`time() - (max by (namespace, name) (x{type="Paused"}) * on (namespace, name) group_left (state) y == 1)`, []string{"x", "y"}},
		{`count(m1 offset 5m) / ignoring (pod) m2 > bool 1e3`, []string{"m1", "m2"}},
		{`rate({__name__="hidden"}[5m])`, nil},
	}
	for _, tt := range tests {
		if got := promQLMetricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("promQLMetricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

func reportAll(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

func loadKSMConfig(t *testing.T, path string) ksmConfig {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := decodeKSMConfig(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cfg
}

// decodeKSMConfig rejects unknown fields with their exact case: kube-state-metrics matches
// keys case-sensitively and ignores the others, while encoding/json would accept "valuefrom".
func decodeKSMConfig(data []byte) (ksmConfig, error) {
	var cfg ksmConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, err
	}
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return cfg, err
	}
	return cfg, exactKeys(generic, reflect.TypeFor[ksmConfig](), "")
}

// exactKeys checks that every object key in v is the JSON name of a field of t, case included.
func exactKeys(v any, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice:
		items, _ := v.([]any)
		for i, item := range items {
			if err := exactKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
	case reflect.Struct:
		obj, _ := v.(map[string]any)
		for key, value := range obj {
			ft, ok := structField(t, key)
			if !ok {
				return fmt.Errorf("unknown field %s.%s", where, key)
			}
			if err := exactKeys(value, ft, where+"."+key); err != nil {
				return err
			}
		}
	}
	return nil
}

func loadDashboard(t *testing.T, path string) dashboard {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

var (
	metricNamePattern = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	ksmEachTypes      = []string{"Gauge", "StateSet", "Info"}
)

func checkKSMConfig(cfg ksmConfig) (errs []error) {
	if cfg.Kind != "CustomResourceStateMetrics" {
		errs = append(errs, fmt.Errorf("kind is %q, want CustomResourceStateMetrics", cfg.Kind))
	}
	if len(cfg.Spec.Resources) != 1 {
		return append(errs, fmt.Errorf("%d resources, want 1 (SubscriptionFlow)", len(cfg.Spec.Resources)))
	}
	r := cfg.Spec.Resources[0]
	gvk := r.GroupVersionKind
	if gvk.Group != subflowv1.GroupVersion.Group || gvk.Version != subflowv1.GroupVersion.Version || gvk.Kind != "SubscriptionFlow" {
		errs = append(errs, fmt.Errorf("groupVersionKind is %s/%s %s, want %s SubscriptionFlow", gvk.Group, gvk.Version, gvk.Kind, subflowv1.GroupVersion))
	}
	root := reflect.TypeFor[subflowv1.SubscriptionFlow]()
	errs = append(errs, checkLabelPaths("resource labelsFromPath", root, r.LabelsFromPath)...)
	seen := map[string]bool{}
	for i, m := range r.Metrics {
		if seen[m.Name] {
			errs = append(errs, fmt.Errorf("metric %q defined twice", m.Name))
		}
		seen[m.Name] = true
		errs = append(errs, checkKSMMetric(fmt.Sprintf("metrics[%d] %q", i, m.Name), root, m)...)
	}
	return errs
}

func checkKSMMetric(where string, root reflect.Type, m ksmMetric) (errs []error) {
	if !metricNamePattern.MatchString(m.Name) {
		errs = append(errs, fmt.Errorf("%s: invalid metric name", where))
	}
	if m.Help == "" {
		errs = append(errs, fmt.Errorf("%s: no help", where))
	}
	errs = append(errs, checkLabelPaths(where+" labelsFromPath", root, m.LabelsFromPath)...)
	spec := map[string]*ksmEachSpec{"Gauge": m.Each.Gauge, "StateSet": m.Each.StateSet, "Info": m.Each.Info}
	each, known := spec[m.Each.Type]
	switch {
	case !known:
		return append(errs, fmt.Errorf("%s: type %q, want one of %v", where, m.Each.Type, ksmEachTypes))
	case each == nil:
		return append(errs, fmt.Errorf("%s: type %s without its %s block", where, m.Each.Type, lowerFirst(m.Each.Type)))
	case m.Each.Type == "StateSet" && (len(each.List) == 0 || each.LabelName == ""):
		errs = append(errs, fmt.Errorf("%s: StateSet needs list and labelName", where))
	case m.Each.Type != "Info" && len(each.Path) == 0:
		errs = append(errs, fmt.Errorf("%s: %s needs a path", where, m.Each.Type))
	}
	return append(errs, checkEachPaths(where, root, each)...)
}

// checkEachPaths resolves path against the API types, then valueFrom and labelsFromPath
// relative to it (to each element when it is a list, as kube-state-metrics iterates lists).
func checkEachPaths(where string, root reflect.Type, each *ksmEachSpec) []error {
	at, err := resolvePath(root, each.Path)
	if err != nil {
		return []error{fmt.Errorf("%s: path %v: %w", where, each.Path, err)}
	}
	if at.Kind() == reflect.Slice {
		at = at.Elem()
	}
	var errs []error
	if _, err := resolvePath(at, each.ValueFrom); err != nil {
		errs = append(errs, fmt.Errorf("%s: valueFrom %v: %w", where, each.ValueFrom, err))
	}
	return append(errs, checkLabelPaths(where+" each labelsFromPath", at, each.LabelsFromPath)...)
}

func checkLabelPaths(where string, at reflect.Type, labels map[string][]string) (errs []error) {
	for label, path := range labels {
		if _, err := resolvePath(at, path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %v: %w", where, label, path, err))
		}
	}
	return errs
}

// resolvePath follows JSON field names through Go types; list lookups such as "[type=Ready]"
// and indexes step into slice elements, any key steps into a map.
func resolvePath(t reflect.Type, path []string) (reflect.Type, error) {
	for _, part := range path {
		next, ok := jsonChild(t, part)
		if !ok {
			return nil, fmt.Errorf("no field %q in %s", part, t)
		}
		t = next
	}
	return t, nil
}

func jsonChild(t reflect.Type, name string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Map, reflect.Slice:
		return t.Elem(), true
	case reflect.Struct:
		return structField(t, name)
	}
	return nil, false
}

func structField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("json"), ",")[0]
		if tag == name {
			return f.Type, true
		}
		if f.Anonymous && tag == "" {
			if ft, ok := jsonChild(f.Type, name); ok {
				return ft, true
			}
		}
	}
	return nil, false
}

func lowerFirst(s string) string { return strings.ToLower(s[:1]) + s[1:] }

// ksmMetricNames are the series names kube-state-metrics exposes for the config.
func ksmMetricNames(cfg ksmConfig) map[string]bool {
	names := map[string]bool{}
	for _, r := range cfg.Spec.Resources {
		prefix := ksmDefaultName
		if r.MetricNamePrefix != nil {
			prefix = *r.MetricNamePrefix
		}
		for _, m := range r.Metrics {
			names[strings.TrimPrefix(prefix+"_"+m.Name, "_")] = true
		}
	}
	return names
}

// goMetricOpts matches `prometheus.<Kind>Opts{ Name: "..."` in the metric definitions.
var goMetricOpts = regexp.MustCompile(`(\w+)Opts\{\s*Name:\s*"([^"]+)"`)

// goMetricNames are the controller's and agent's series names, with the series a histogram
// or summary expands into.
func goMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, path := range goMetricSources {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		matches := goMetricOpts.FindAllStringSubmatch(string(src), -1)
		if len(matches) == 0 {
			t.Fatalf("%s: no metric definitions found; has the Opts{Name: ...} style changed?", path)
		}
		for _, m := range matches {
			for _, suffix := range seriesSuffixes[m[1]] {
				names[m[2]+suffix] = true
			}
		}
	}
	return names
}

var seriesSuffixes = map[string][]string{
	"Gauge":     {""},
	"Counter":   {""},
	"Histogram": {"", "_bucket", "_sum", "_count"},
	"Summary":   {"", "_sum", "_count"},
}

func checkDashboard(d dashboard, known map[string]bool) (errs []error) {
	if d.Title == "" || d.UID == "" {
		errs = append(errs, fmt.Errorf("dashboard needs a title and a uid"))
	}
	if d.SchemaVersion < 36 {
		errs = append(errs, fmt.Errorf("schemaVersion %d, want >= 36 (datasource references by uid)", d.SchemaVersion))
	}
	dsVar, exprs := "", []string(nil)
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Query == "prometheus" {
			dsVar = v.Name
		}
		exprs = append(exprs, labelValuesMetric(v.Definition)...)
	}
	if dsVar == "" {
		errs = append(errs, fmt.Errorf("no prometheus datasource variable"))
	}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		if ids[p.ID] {
			errs = append(errs, fmt.Errorf("panels[%d]: id %d used twice", i, p.ID))
		}
		ids[p.ID] = true
		errs = append(errs, checkPanel(fmt.Sprintf("panels[%d] %q", i, p.Title), p, dsVar)...)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return append(errs, checkMetricsDefined(exprs, known)...)
}

func checkPanel(where string, p panel, dsVar string) (errs []error) {
	if p.Title == "" {
		errs = append(errs, fmt.Errorf("%s: no title", where))
	}
	if p.Datasource == nil || p.Datasource.UID != "${"+dsVar+"}" {
		errs = append(errs, fmt.Errorf("%s: datasource must be the ${%s} variable", where, dsVar))
	}
	if len(p.Targets) == 0 {
		errs = append(errs, fmt.Errorf("%s: no targets", where))
	}
	for _, tg := range p.Targets {
		if tg.RefID == "" || strings.TrimSpace(tg.Expr) == "" {
			errs = append(errs, fmt.Errorf("%s: target %q needs a refId and an expr", where, tg.RefID))
		}
	}
	return errs
}

func checkMetricsDefined(exprs []string, known map[string]bool) (errs []error) {
	for _, expr := range exprs {
		for _, name := range promQLMetricNames(expr) {
			if !known[name] {
				errs = append(errs, fmt.Errorf("metric %s in %q is defined neither in %v nor in %s", name, expr, goMetricSources, ksmConfigPath))
			}
		}
	}
	return errs
}

var labelValuesCall = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// labelValuesMetric returns the metric of a Grafana label_values(metric, label) query as an expression.
func labelValuesMetric(definition string) []string {
	if m := labelValuesCall.FindStringSubmatch(definition); m != nil {
		return []string{m[1]}
	}
	return nil
}

var (
	promQLStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promQLMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promQLGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promQLTokens    = regexp.MustCompile(`\$\{[^}]*\}|\$\w+|[a-zA-Z_:][a-zA-Z0-9_:]*|[0-9][0-9a-zA-Z.+-]*`)
	promQLNonMetric = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "stddev": true, "stdvar": true,
		"topk": true, "bottomk": true, "quantile": true, "count_values": true, "group": true,
	}
)

// promQLMetricNames returns the metric names an expression selects, in order: identifiers left
// once strings, label matchers, ranges and grouping lists are removed, minus keywords,
// aggregations, function calls, numbers and Grafana variables.
func promQLMetricNames(expr string) []string {
	s := promQLStrings.ReplaceAllString(expr, `""`)
	s = promQLMatchers.ReplaceAllString(s, " ")
	s = promQLGrouping.ReplaceAllString(s, "$1 ")
	var names []string
	for _, loc := range promQLTokens.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if !metricNamePattern.MatchString(tok) || promQLNonMetric[strings.ToLower(tok)] || isCall(s[loc[1]:]) {
			continue
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names
}

func isCall(rest string) bool { return strings.HasPrefix(strings.TrimSpace(rest), "(") }
