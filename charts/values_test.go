package charts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestSchemaRefusesMistakes: values.schema.json makes helm refuse a misspelt key at every level
// a user sets, and a value of the wrong type, with a message naming it; the values the tests
// render (nonDefault) pass.
func TestSchemaRefusesMistakes(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"replicas=2", "additional properties 'replicas' not allowed"},
		{"replicaCount=abc", "at '/replicaCount': got string, want integer"},
		{"replicaCount=-1", "/replicaCount"},
		{"image.tags=v1", "additional properties 'tags' not allowed"},
		{"controller.resyncPeriod=5m", "additional properties 'resyncPeriod' not allowed"},
		{"controller.resync=5 minutes", "/controller/resync"},
		{"webhook.prot=10250", "additional properties 'prot' not allowed"},
		{"webhook.port=abc", "at '/webhook/port': got string, want integer"},
		{"webhook.port=70000", "/webhook/port"},
		{"webhook.certs=vault", "/webhook/certs"},
		{"webhook.sidecarResources.requests.memroy=32Mi", "additional properties 'memroy' not allowed"},
		{"metrics.service.typ=NodePort", "additional properties 'typ' not allowed"},
		{"rbac.aggregateRole=false", "additional properties 'aggregateRole' not allowed"},
		{"podDisruptionBudget.minAvailable=half", "/podDisruptionBudget/minAvailable"},
		{"topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname", "/topologySpreadConstraints/0"},
		{"monitoring.serviceMonitor.honorLabels=false", "additional properties 'honorLabels' not allowed"},
		{"monitoring.podMonitor.interval=often", "/monitoring/podMonitor/interval"},
		{"monitoring.prometheusRule.enable=true", "additional properties 'enable' not allowed"},
		{"pauseWhen.prometheusUrl=http://prometheus:9090", "additional properties 'prometheusUrl' not allowed"},
		{"pauseWhen.prometheusURL=prometheus:9090", "/pauseWhen/prometheusURL"},
		{"pauseWhen.readableResources[0].resources[0]=clusters", "/pauseWhen/readableResources/0"},
		{"pauseWhen.readableResources[0].apiGroup[0]=postgresql.cnpg.io", "additional properties 'apiGroup' not allowed"},
	} {
		out, err := helmResult(t, "template", "subflow", chartDir, "--set", tc.set)
		if err == nil {
			t.Errorf("--set %s: helm template accepted it", tc.set)
			continue
		}
		if !strings.Contains(out, tc.want) || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s: helm said\n%s\nwant the schema's refusal with %q", tc.set, out, tc.want)
		}
	}
	// Free-form maps stay free, and the documented forms of a value pass.
	render(t, "subflow", "subflow-system", "podLabels.team=payments", "podAnnotations.example\\.com/owner=payments",
		"nodeSelector.kubernetes\\.io/os=linux", "metrics.service.annotations.a=b", "controller.logLevel=5",
		"webhook.certManager.issuerRef.kind=ClusterIssuer", "webhook.certManager.issuerRef.name=my-ca", "webhook.certs=cert-manager",
		"podDisruptionBudget.minAvailable=2", "controller.resync=1m30s")
}

// helmResult runs go tool helm like helm does, returning its output and error instead of failing.
func helmResult(t *testing.T, args ...string) (string, error) {
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
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

// TestValuesInSchema: every key of values.yaml is a property of values.schema.json, with the
// same type as its default, and every object the schema describes refuses unknown keys unless
// its content is the user's (freeForm, labels, annotations and the Kubernetes objects passed
// through).
func TestValuesInSchema(t *testing.T) {
	var values map[string]any
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	data, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, value any, node map[string]any)
	walk = func(path string, value any, node map[string]any) {
		if node == nil {
			t.Errorf("values key %s is not in values.schema.json", path)
			return
		}
		if typ, ok := node["type"].(string); ok && typ != jsonType(value) {
			t.Errorf("values key %s: default %v is a %s, the schema wants %s", path, value, jsonType(value), typ)
		}
		m, isMap := value.(map[string]any)
		props, hasProps := node["properties"].(map[string]any)
		if !isMap || !hasProps {
			return
		}
		if node["additionalProperties"] != false {
			t.Errorf("values key %s: the schema accepts unknown keys (additionalProperties is not false)", path)
		}
		for k, v := range m {
			sub, _ := props[k].(map[string]any)
			walk(strings.TrimPrefix(path+"."+k, "."), v, sub)
		}
	}
	if schema["additionalProperties"] != false {
		t.Error("values.schema.json accepts unknown top-level keys")
	}
	walk("", values, schema)
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, int, int64:
		return "integer"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// checkDisruptionAndSpread: the controller's PodDisruptionBudget keeps minAvailable of the
// controller's pods and no others, and the Deployment spreads them over topologyKey, selecting
// its own pods.
func checkDisruptionAndSpread(t *testing.T, objs []*unstructured.Unstructured, minAvailable, topologyKey, when string) {
	t.Helper()
	deployment := find(objs, "Deployment", "subflow-controller")
	podLabels, _, _ := unstructured.NestedStringMap(deployment.Object, "spec", "template", "metadata", "labels")
	pdb := find(objs, "PodDisruptionBudget", "subflow-controller")
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget subflow-controller")
	}
	if got, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable"); fmt.Sprint(got) != minAvailable {
		t.Errorf("PodDisruptionBudget minAvailable %v, want %s", got, minAvailable)
	}
	selector, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	if !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) || selector["app.kubernetes.io/component"] != "controller" {
		t.Errorf("the PodDisruptionBudget selects %v, not the controller's pods %v", selector, podLabels)
	}
	spread, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "topologySpreadConstraints")
	if len(spread) != 1 {
		t.Fatalf("topologySpreadConstraints %v, want one", spread)
	}
	c := spread[0].(map[string]any)
	matchLabels, _, _ := unstructured.NestedStringMap(c, "labelSelector", "matchLabels")
	if c["topologyKey"] != topologyKey || c["whenUnsatisfiable"] != when || fmt.Sprint(c["maxSkew"]) != "1" ||
		len(matchLabels) == 0 || !labels.SelectorFromSet(matchLabels).Matches(labels.Set(podLabels)) {
		t.Errorf("topologySpreadConstraints %v, want maxSkew 1 over %s, %s, selecting the controller's pods %v", c, topologyKey, when, podLabels)
	}
}

// checkWebhookPort: the controller listens on webhook.port, and the Service the webhook
// configurations name sends 443 there.
func checkWebhookPort(t *testing.T, objs []*unstructured.Unstructured, port string) {
	t.Helper()
	deployment := find(objs, "Deployment", "subflow-controller")
	_, args := container(t, deployment)
	if !slices.Contains(args, "--webhook-port="+port) {
		t.Errorf("args %v lack --webhook-port=%s", args, port)
	}
	containers, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "ports")
	var named string
	for _, p := range ports {
		if p := p.(map[string]any); fmt.Sprint(p["containerPort"]) == port {
			named = fmt.Sprint(p["name"])
		}
	}
	service := find(objs, "Service", "subflow-webhook-service")
	servicePorts, _, _ := unstructured.NestedSlice(service.Object, "spec", "ports")
	if named == "" || len(servicePorts) != 1 || servicePorts[0].(map[string]any)["targetPort"] != named ||
		fmt.Sprint(servicePorts[0].(map[string]any)["port"]) != "443" {
		t.Errorf("container port %s named %q; webhook Service ports %v", port, named, servicePorts)
	}
}

// checkMonitors: the ServiceMonitor scrapes the metrics Service (and only it) and the PodMonitor
// the agents' control port, both with honorLabels, which the alerts need.
func checkMonitors(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	sm, pm := find(objs, "ServiceMonitor", "subflow-controller"), find(objs, "PodMonitor", "subflow-agents")
	if sm == nil || pm == nil {
		t.Fatalf("ServiceMonitor %v, PodMonitor %v", sm != nil, pm != nil)
	}
	if sm.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v lack monitoring.serviceMonitor.labels", sm.GetLabels())
	}
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for _, o := range objs {
		if o.GetKind() == "Service" && labels.SelectorFromSet(selector).Matches(labels.Set(o.GetLabels())) != (o.GetName() == "subflow-metrics") {
			t.Errorf("the ServiceMonitor's selector %v and Service %s", selector, o.GetName())
		}
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	metricsService := find(objs, "Service", "subflow-metrics")
	servicePorts, _, _ := unstructured.NestedSlice(metricsService.Object, "spec", "ports")
	if len(endpoints) != 1 || len(servicePorts) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, metrics Service ports %v", endpoints, servicePorts)
	}
	e := endpoints[0].(map[string]any)
	if e["honorLabels"] != true || e["port"] != servicePorts[0].(map[string]any)["name"] || e["scheme"] != "https" ||
		e["bearerTokenFile"] == nil || e["interval"] != "30s" {
		t.Errorf("ServiceMonitor endpoint %v: want honorLabels, the metrics Service's port %v over https with Prometheus' token, interval 30s", e, servicePorts[0])
	}
	// One endpoint per port an agent may serve on: subflow (plain) and subflow-https (TLS, the
	// port the controller calls over https). A pod has one of them, so each agent is scraped once.
	podEndpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(podEndpoints) != 2 {
		t.Fatalf("PodMonitor endpoints %v: want subflow and subflow-https", podEndpoints)
	}
	for i, port := range []string{"subflow", "subflow-https"} {
		pe := podEndpoints[i].(map[string]any)
		if pe["honorLabels"] != true || pe["port"] != port || pe["path"] != "/metrics" || pe["interval"] != "1m" {
			t.Errorf("PodMonitor endpoint %v: want honorLabels on the agents' port %s, interval 1m", pe, port)
		}
	}
	if tls := podEndpoints[1].(map[string]any); tls["scheme"] != "https" || toJSON(t, tls["tlsConfig"]) != `{"insecureSkipVerify":true}` {
		t.Errorf("PodMonitor endpoint %v: want subflow-https scraped over https with monitoring.podMonitor.tlsConfig", tls)
	}
	if plain := podEndpoints[0].(map[string]any); plain["scheme"] != nil || plain["tlsConfig"] != nil {
		t.Errorf("PodMonitor endpoint %v: want the port subflow scraped over http", plain)
	}
	names, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
	if !slices.Equal(names, []string{"shop"}) {
		t.Errorf("PodMonitor namespaceSelector %v", pm.Object["spec"].(map[string]any)["namespaceSelector"])
	}
	expressions, _, _ := unstructured.NestedSlice(pm.Object, "spec", "selector", "matchExpressions")
	if toJSON(t, expressions) != `[{"key":"subflow.dev/inject","operator":"Exists"}]` {
		t.Errorf("PodMonitor selects %s, want the pods labelled subflow.dev/inject", toJSON(t, expressions))
	}
}

// TestSidecarImageFollowsTheController: the sidecar the webhook injects into new pods is of the
// controller's release (image.tag, else the chart's appVersion) unless webhook.sidecarImage names a
// tag or a digest, so that helm upgrade moves both; empty leaves sidecar pods unwired.
func TestSidecarImageFollowsTheController(t *testing.T) {
	app := chartAppVersion(t)
	digest := "sha256:" + strings.Repeat("0a", 32)
	for _, tc := range []struct {
		values []string
		want   string // --sidecar-image's value; empty: no flag
	}{
		{nil, "subflow-sidecar:" + app},
		{[]string{"image.tag=v1.2.3"}, "subflow-sidecar:v1.2.3"},
		{[]string{"webhook.sidecarImage=myregistry:5000/team/subflow-sidecar"}, "myregistry:5000/team/subflow-sidecar:" + app},
		{[]string{"image.tag=v1.2.3", "webhook.sidecarImage=team/subflow-sidecar"}, "team/subflow-sidecar:v1.2.3"},
		{[]string{"image.tag=v1.2.3", "webhook.sidecarImage=team/subflow-sidecar:v1.1.0"}, "team/subflow-sidecar:v1.1.0"},
		{[]string{"webhook.sidecarImage=team/subflow-sidecar@" + digest}, "team/subflow-sidecar@" + digest},
		{[]string{"webhook.sidecarImage="}, ""},
	} {
		t.Run(strings.Join(tc.values, ","), func(t *testing.T) {
			_, args := container(t, find(render(t, "subflow", "subflow-system", tc.values...), "Deployment", "subflow-controller"))
			var got []string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--sidecar-image="); ok {
					got = append(got, v)
				}
			}
			want := []string{tc.want}
			if tc.want == "" {
				want = nil
			}
			if !slices.Equal(got, want) {
				t.Errorf("--sidecar-image %q, want %q", got, want)
			}
		})
	}
}
