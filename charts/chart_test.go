// Package charts holds subflow's Helm chart (charts/subflow). Its tests lint and render the chart
// with the Helm of go.mod's tool directive (go tool helm, so nothing is downloaded), apply what it
// renders server-side to a real API server (envtest) with kubectl, and check that the chart and
// config/default grant the controller the same permissions.
package charts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

var (
	repoRoot = testenv.RepoRoot()
	chartDir = filepath.Join(repoRoot, "charts", "subflow")
)

// nonDefault are the non-default values the tests render and apply: cert-manager instead of the
// self-managed certificate, every monitoring object, another image, two replicas spread over
// zones, another webhook port, spec.pauseWhen's Prometheus and a further readable kind.
var nonDefault = []string{
	"webhook.certs=cert-manager",
	"webhook.port=10250",
	"monitoring.prometheusRule.enabled=true",
	"monitoring.prometheusRule.labels.release=kube-prometheus-stack",
	"monitoring.serviceMonitor.enabled=true",
	"monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
	"monitoring.serviceMonitor.interval=30s",
	"monitoring.podMonitor.enabled=true",
	"monitoring.podMonitor.interval=1m",
	"monitoring.podMonitor.namespaceSelector.any=false",
	"monitoring.podMonitor.namespaceSelector.matchNames[0]=shop",
	"monitoring.dashboard.enabled=true",
	"podDisruptionBudget.minAvailable=50%",
	"topologySpreadConstraints[0].maxSkew=1",
	"topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
	"topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
	"pauseWhen.prometheusURL=http://prometheus-operated.monitoring.svc:9090",
	"pauseWhen.readableResources[0].apiGroups[0]=postgresql.cnpg.io",
	"pauseWhen.readableResources[0].resources[0]=clusters",
	"image.repository=team/subflow-controller",
	"image.tag=v1.2.3",
	"replicaCount=2",
	"webhook.sidecarImage=team/subflow-sidecar:v1.2.3",
	"controller.resync=2m",
	"controller.maxConcurrentStatusWrites=2",
	"controller.refreshPushesPerSecond=50",
	"controller.logLevel=debug",
}

// helm runs the Helm of go.mod's tool directive, with its caches and configuration in a
// temporary directory.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go on PATH: the chart tests run Helm as `go tool helm` (go.mod's tool directive)")
	}
	home := t.TempDir()
	cmd := exec.Command(goBin, append([]string{"tool", "helm"}, args...)...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if !strings.Contains(stderr.String()+stdout.String(), "Error:") {
			t.Fatalf("go tool helm could not run (helm.sh/helm/v4/cmd/helm is a tool in go.mod; `go tool helm version` shows why): %v\n%s", err, stderr.String())
		}
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// render is `helm template` of the chart as release in namespace with --set values.
func render(t *testing.T, release, namespace string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	objs, err := decode(helm(t, args...))
	if err != nil {
		t.Fatalf("helm template %v: %v", values, err)
	}
	return objs
}

func decode(manifests string) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	var out []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.UnmarshalStrict(doc, &m); err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// kustomize renders a directory of config/ as kubectl kustomize does.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot, "config", dir))
	if err != nil {
		t.Fatalf("kustomize config/%s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// TestChartCopiesMatchConfig: the chart's files/ are copies of what controller-gen generates and
// of config/monitoring, so the chart installs the same CRD, manager role, webhooks and alerts.
func TestChartCopiesMatchConfig(t *testing.T) {
	copies := map[string]string{
		"files/crds/subflow.dev_subscriptionflows.yaml": "config/crd/bases/subflow.dev_subscriptionflows.yaml",
		"files/manager-role.yaml":                       "config/rbac/role.yaml",
		"files/webhooks.yaml":                           "config/webhook/manifests.yaml",
		"files/prometheusrule.yaml":                     "config/monitoring/prometheusrule.yaml",
		"files/grafana-dashboard.json":                  "config/monitoring/grafana-dashboard.json",
	}
	for copied, source := range copies {
		want, err := os.ReadFile(filepath.Join(repoRoot, source))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, copied))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/subflow/%s differs from %s: run make manifests (or make chart-files)", copied, source)
		}
	}
	crds, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) != 1 {
		t.Errorf("config/crd/bases holds %d CRDs (%v); the chart copies subflow.dev_subscriptionflows.yaml alone: add the others to make chart-files and this test", len(crds), err)
	}
}

func TestLint(t *testing.T) {
	helm(t, "lint", "--strict", chartDir)
	args := []string{"lint", "--strict", chartDir}
	for _, v := range nonDefault {
		args = append(args, "--set", v)
	}
	helm(t, args...)
	// Everything optional off: a controller without webhooks or metrics, RBAC and CRD managed elsewhere.
	minimal := render(t, "subflow", "subflow-system", "webhook.enabled=false", "metrics.enabled=false", "rbac.create=false",
		"rbac.userRoles=false", "rbac.aggregateRoles=false", "serviceAccount.create=false", "serviceAccount.name=existing", "crds.install=false",
		"podDisruptionBudget.enabled=false", "monitoring.serviceMonitor.enabled=true")
	if len(minimal) != 1 || minimal[0].GetKind() != "Deployment" {
		var kinds []string
		for _, o := range minimal {
			kinds = append(kinds, o.GetKind()+" "+o.GetName())
		}
		t.Errorf("with everything optional off the chart renders %v, want the Deployment alone", kinds)
	} else if _, args := container(t, minimal[0]); !slices.Contains(args, "--enable-webhooks=false") || !slices.Contains(args, "--metrics-bind-address=0") {
		t.Errorf("args %v, want --enable-webhooks=false and --metrics-bind-address=0", args)
	}
	// One replica has no disruption budget (it would block every drain), and topology spreading
	// turns off with an empty list.
	single := render(t, "subflow", "subflow-system", "replicaCount=1", "leaderElect=false", "topologySpreadConstraints=null")
	if pdb := find(single, "PodDisruptionBudget", "subflow-controller"); pdb != nil {
		t.Error("with replicaCount=1 the chart renders a PodDisruptionBudget")
	}
	if spread, ok, _ := unstructured.NestedSlice(find(single, "Deployment", "subflow-controller").Object, "spec", "template", "spec", "topologySpreadConstraints"); ok {
		t.Errorf("with topologySpreadConstraints=null the Deployment spreads: %v", spread)
	}
	// rbac.secretsPolicy=false leaves the admission policy out (for policies managed otherwise).
	for _, o := range render(t, "subflow", "subflow-system", "rbac.secretsPolicy=false") {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			t.Errorf("with rbac.secretsPolicy=false the chart renders %s %s", o.GetKind(), o.GetName())
		}
	}
}

// TestRenderDefault: the default values install what config/default does, under the same names
// when the release is called subflow in subflow-system.
func TestRenderDefault(t *testing.T) {
	objs := render(t, "subflow", "subflow-system")
	want := map[string][]string{
		"CustomResourceDefinition":         {"subscriptionflows.subflow.dev"},
		"ServiceAccount":                   {"subflow-controller"},
		"Deployment":                       {"subflow-controller"},
		"Service":                          {"subflow-webhook-service", "subflow-metrics"},
		"Secret":                           {"subflow-webhook-server-cert"},
		"MutatingWebhookConfiguration":     {"subflow-mutating-webhook-configuration"},
		"ValidatingWebhookConfiguration":   {"subflow-validating-webhook-configuration"},
		"ValidatingAdmissionPolicy":        {"subflow-controller-secrets"},
		"ValidatingAdmissionPolicyBinding": {"subflow-controller-secrets"},
		"PodDisruptionBudget":              {"subflow-controller"},
		"ClusterRole":                      {"subflow-view", "subflow-edit"},
		"Pod":                              {"subflow-test-webhook"},
	}
	for kind, names := range want {
		for _, name := range names {
			if find(objs, kind, name) == nil {
				t.Errorf("the default values render no %s %s", kind, name)
			}
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Certificate", "Issuer", "PrometheusRule", "ConfigMap", "ServiceMonitor", "PodMonitor":
			t.Errorf("the default values render %s %s", o.GetKind(), o.GetName())
		}
	}
	deployment := find(objs, "Deployment", "subflow-controller")
	if deployment == nil {
		t.FailNow()
	}
	image, args := container(t, deployment)
	if image != "subflow-controller:"+chartAppVersion(t) {
		t.Errorf("image %q, want subflow-controller:<appVersion> (the user sets the registry)", image)
	}
	for _, arg := range []string{"--webhook-certs=self-managed", "--leader-elect=true", "--metrics-bind-address=:8443"} {
		if !slices.Contains(args, arg) {
			t.Errorf("args %v lack %s", args, arg)
		}
	}
	for _, arg := range args {
		if strings.HasPrefix(arg, "--refresh-pushes-per-second") {
			t.Errorf("the default values pass %s: they leave the controller's default", arg)
		}
	}
	if n, _, _ := unstructured.NestedFieldNoCopy(deployment.Object, "spec", "replicas"); fmt.Sprint(n) != "2" {
		t.Errorf("replicas %v, want 2", n)
	}
	checkFlagsExist(t, args)
	checkDisruptionAndSpread(t, objs, "1", "kubernetes.io/hostname", "ScheduleAnyway")
	checkWebhookPort(t, objs, "9443")

	// The webhooks are config/default's, rules, selectors and failure policy alike.
	config := kustomize(t, "default")
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		name := map[string]string{"MutatingWebhookConfiguration": "subflow-mutating-webhook-configuration",
			"ValidatingWebhookConfiguration": "subflow-validating-webhook-configuration"}[kind]
		chart, kust := find(objs, kind, name), find(config, kind, name)
		if chart == nil || kust == nil {
			t.Fatalf("%s %s: chart %v, config/default %v", kind, name, chart != nil, kust != nil)
		}
		if got, want := toJSON(t, chart.Object["webhooks"]), toJSON(t, kust.Object["webhooks"]); got != want {
			t.Errorf("%s webhooks differ from config/default's:\nchart:  %s\nconfig: %s", kind, got, want)
		}
	}
	// The admission policy on the controller's Secret creates is config/default's: the same
	// expressions, naming the same ServiceAccount, bound the same way.
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		chart, kust := find(objs, kind, "subflow-controller-secrets"), find(config, kind, "subflow-controller-secrets")
		if chart == nil || kust == nil {
			t.Fatalf("%s subflow-controller-secrets: chart %v, config/default %v", kind, chart != nil, kust != nil)
		}
		if got, want := toJSON(t, chart.Object["spec"]), toJSON(t, kust.Object["spec"]); got != want {
			t.Errorf("%s spec differs from config/default's:\nchart:  %s\nconfig: %s", kind, got, want)
		}
	}
	// The CRD is config/crd/bases' (only Helm's keep annotation and labels added).
	crd, base := find(objs, "CustomResourceDefinition", "subscriptionflows.subflow.dev"), find(config, "CustomResourceDefinition", "subscriptionflows.subflow.dev")
	if got, want := toJSON(t, crd.Object["spec"]), toJSON(t, base.Object["spec"]); got != want {
		t.Error("the chart's CRD spec differs from config/crd/bases'")
	}
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Error("the CRD lacks helm.sh/resource-policy: keep: helm uninstall would delete every SubscriptionFlow")
	}
}

// TestRenderNonDefault: cert-manager issues the certificate (config/cert-manager's objects), the
// monitoring objects are rendered from config/monitoring, the image and replicas follow the values.
func TestRenderNonDefault(t *testing.T) {
	objs := render(t, "subflow", "subflow-system", append(nonDefault, "replicaCount=3")...)
	for kind, name := range map[string]string{"Issuer": "subflow-selfsigned-issuer", "Certificate": "subflow-serving-cert",
		"PrometheusRule": "subflow-alerts", "ConfigMap": "subflow-dashboard"} {
		if find(objs, kind, name) == nil {
			t.Errorf("no %s %s", kind, name)
		}
	}
	if find(objs, "Secret", "subflow-webhook-server-cert") != nil {
		t.Error("with cert-manager the chart renders the Secret cert-manager creates")
	}
	cert := find(objs, "Certificate", "subflow-serving-cert")
	if cert != nil {
		dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		if !slices.Contains(dns, "subflow-webhook-service.subflow-system.svc") || secret != "subflow-webhook-server-cert" {
			t.Errorf("Certificate dnsNames %v secretName %q", dns, secret)
		}
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		for _, o := range objs {
			if o.GetKind() == kind && o.GetAnnotations()["cert-manager.io/inject-ca-from"] != "subflow-system/subflow-serving-cert" {
				t.Errorf("%s %s: inject-ca-from %q", kind, o.GetName(), o.GetAnnotations()["cert-manager.io/inject-ca-from"])
			}
		}
	}
	deployment := find(objs, "Deployment", "subflow-controller")
	image, args := container(t, deployment)
	if image != "team/subflow-controller:v1.2.3" {
		t.Errorf("image %q", image)
	}
	for _, arg := range []string{"--webhook-certs=files", "--sidecar-image=team/subflow-sidecar:v1.2.3", "--resync=2m", "--max-concurrent-status-writes=2", "--zap-log-level=debug",
		"--refresh-pushes-per-second=50", "--prometheus-url=http://prometheus-operated.monitoring.svc:9090"} {
		if !slices.Contains(args, arg) {
			t.Errorf("args %v lack %s", args, arg)
		}
	}
	checkFlagsExist(t, args)
	if n, _, _ := unstructured.NestedFieldNoCopy(deployment.Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
		t.Errorf("replicas %v, want 3", n)
	}
	checkDisruptionAndSpread(t, objs, "50%", "topology.kubernetes.io/zone", "DoNotSchedule")
	checkWebhookPort(t, objs, "10250")
	checkMonitors(t, objs)
	// pauseWhen.readableResources: get, and only get, on a CloudNativePG Cluster.
	role := permissions(t, objs)
	if !role["ClusterRole subflow-manager-role: get clusters.postgresql.cnpg.io *"] {
		t.Error("pauseWhen.readableResources grants no get on clusters.postgresql.cnpg.io")
	}
	for key := range role {
		if strings.Contains(key, "postgresql.cnpg.io") && !strings.Contains(key, ": get clusters.") {
			t.Errorf("pauseWhen.readableResources grants more than get: %s", key)
		}
	}
	volumes, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "volumes")
	if !strings.Contains(toJSON(t, volumes), `"secretName":"subflow-webhook-server-cert"`) {
		t.Errorf("the controller does not mount cert-manager's Secret: %s", toJSON(t, volumes))
	}
	rule := find(objs, "PrometheusRule", "subflow-alerts")
	if rule != nil {
		var source map[string]any
		data, err := os.ReadFile(filepath.Join(repoRoot, "config", "monitoring", "prometheusrule.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &source); err != nil {
			t.Fatal(err)
		}
		if toJSON(t, rule.Object["spec"]) != toJSON(t, source["spec"]) {
			t.Error("the PrometheusRule's spec differs from config/monitoring/prometheusrule.yaml's")
		}
		if rule.GetLabels()["release"] != "kube-prometheus-stack" {
			t.Errorf("PrometheusRule labels %v lack monitoring.prometheusRule.labels", rule.GetLabels())
		}
	}
	if cm := find(objs, "ConfigMap", "subflow-dashboard"); cm != nil {
		dashboard, err := os.ReadFile(filepath.Join(repoRoot, "config", "monitoring", "grafana-dashboard.json"))
		if err != nil {
			t.Fatal(err)
		}
		got, _, _ := unstructured.NestedString(cm.Object, "data", "subflow.json")
		if strings.TrimSpace(got) != strings.TrimSpace(string(dashboard)) || cm.GetLabels()["grafana_dashboard"] != "1" {
			t.Errorf("the dashboard ConfigMap (labels %v) does not hold config/monitoring/grafana-dashboard.json", cm.GetLabels())
		}
	}
}

func container(t *testing.T, deployment *unstructured.Unstructured) (image string, args []string) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	c := containers[0].(map[string]any)
	image, _ = c["image"].(string)
	args, _, _ = unstructured.NestedStringSlice(c, "args")
	return image, args
}

// checkFlagsExist: every --flag the chart passes is one main.go defines (or zap's, which main.go
// binds), so a renamed flag cannot leave the chart's controller failing at start.
func checkFlagsExist(t *testing.T, args []string) {
	t.Helper()
	defined := mainFlags(t)
	for _, f := range []string{"zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"} {
		defined[f] = true
	}
	for _, arg := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !defined[name] {
			t.Errorf("the chart passes %s, a flag main.go does not define", arg)
		}
	}
}

// mainFlags reads the names of the flags main.go defines (flag.XxxVar(&v, "name", ...)).
func mainFlags(t *testing.T) map[string]bool {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot, "main.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true // a plain call, e.g. withElection(...)
		}
		if pkg, isIdent := sel.X.(*ast.Ident); !isIdent || pkg.Name != "flag" || len(call.Args) < 2 {
			return true
		}
		index := 0
		if strings.HasSuffix(sel.Sel.Name, "Var") {
			index = 1
		}
		if lit, ok := call.Args[index].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, _ := strconv.Unquote(lit.Value)
			flags[name] = true
		}
		return true
	})
	if len(flags) < 10 {
		t.Fatalf("found only %d flags in main.go: %v", len(flags), flags)
	}
	return flags
}

func chartAppVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	return chart.AppVersion
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestValuesDocumented: every key of values.yaml has a row in the chart's README.
func TestValuesDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !freeForm[prefix+k] {
				walk(prefix+k+".", sub)
				continue
			}
			keys = append(keys, prefix+k)
		}
	}
	walk("", values)
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.Contains(string(readme), "| `"+k+"` |") {
			t.Errorf("values key %s has no row (| `%s` | default | meaning |) in charts/subflow/README.md", k, k)
		}
	}
}

// freeForm are values whose content is the user's (maps passed through as they are).
var freeForm = map[string]bool{"resources": true, "monitoring.dashboard.labels": true,
	"monitoring.serviceMonitor.tlsConfig": true, "monitoring.podMonitor.namespaceSelector": true,
	"monitoring.podMonitor.tlsConfig": true}
