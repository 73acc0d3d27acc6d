package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// consumerKind is a consumer application as users deploy it: the example Go consumer with the
// agent linked in, or a stock Java or Python client behind the injected protocol sidecar. Each
// is onboarded by its label only.
type consumerKind struct {
	name string
	// mode is the subflow.dev/inject label's value.
	mode string
	// image is the application's image.
	image string
	// replicas is how many pods a test's Deployment starts with.
	replicas int
}

var (
	goAgent       = consumerKind{name: "go-agent", mode: "agent", image: image("subflow-example-consumer"), replicas: 3}
	javaSidecar   = consumerKind{name: "java-sidecar", mode: "sidecar", image: image("subflow-e2e-java-peer"), replicas: 2}
	pythonSidecar = consumerKind{name: "python-sidecar", mode: "sidecar", image: image("subflow-e2e-python-peer"), replicas: 2}
	everyConsumer = []consumerKind{goAgent, javaSidecar, pythonSidecar}
)

// deploy makes what a namespace needs for this kind (for sidecars the ConfigMap that names the
// broker, as README says) and applies a Deployment of it; extra is appended to the app
// container (e.g. a securityContext).
func (k consumerKind) deploy(t *testing.T, ns, name string, replicas int, topic, subscription, extra string) {
	t.Helper()
	brokerURL, adminURL := brokerService(t, ns)
	if k.mode == "agent" {
		apply(t, consumerDeployment(ns, name, replicas, brokerURL, adminURL, topic, subscription)+extra)
		return
	}
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: subflow, namespace: %s}
data: {brokerServiceURL: %q, adminServiceURL: %q}
`, ns, brokerURL, adminURL))
	apply(t, peerDeployment(ns, name, k.image, replicas, topic, subscription)+extra)
}

// peerDeployment is a Deployment of a stock-client consumer (hack/clients) opted in to the
// sidecar by its label: it connects to $PULSAR_SERVICE_URL, which the webhook sets, and prints
// a JSON line for each message it processed. Its standard input is kept open: the peers end
// when it closes.
func peerDeployment(ns, name, img string, replicas int, topic, subscription string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata:
      labels: {app: %[2]s, subflow.dev/inject: sidecar}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: app
        image: %[4]s
        imagePullPolicy: IfNotPresent
        stdin: true
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        args: ["--url", "$(PULSAR_SERVICE_URL)", "--topic", %[5]q, "--subscription", %[6]q, "--type", "Shared", "--name", "$(POD_NAME)"]
`, ns, name, replicas, img, topic, subscription)
}

// kinds runs test once for each kind of consumer, in parallel: each has its own namespace.
func kinds(t *testing.T, kinds []consumerKind, test func(t *testing.T, k consumerKind)) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			test(t, k)
		})
	}
}

// namespaceFor names a test's namespace for a kind of consumer.
func namespaceFor(prefix string, k consumerKind) string {
	return prefix + "-" + strings.TrimSuffix(strings.TrimSuffix(k.name, "-agent"), "-sidecar")
}
