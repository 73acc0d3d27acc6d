# subflow - declarative pause, resume, stop and seek for Apache Pulsar subscriptions.

# Images (hack/images; the chart and kustomize use the same names): <REGISTRY>/subflow-controller
# and <REGISTRY>/subflow-sidecar, tagged TAG. An empty REGISTRY leaves the names bare.
REGISTRY ?=
TAG ?= dev
ARCH ?= $(shell $(GO) env GOARCH)
IMG ?= $(if $(REGISTRY),$(REGISTRY)/)subflow-controller:$(TAG)
# OVERLAY picks the installation under config/: default (the controller manages its webhook
# certificates) or cert-manager.
OVERLAY ?= default
GO ?= go
CONTROLLER_GEN = $(GO) tool controller-gen
# Real kube-apiserver and etcd for tests and the demo; built once from the Go module proxy.
ENVTEST_ASSETS = $(shell hack/setup-envtest.sh)
TEST_FLAGS ?= -race -count=1 -timeout 30m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate the CRD, RBAC and webhook manifests and the API reference from markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac output:webhook:artifacts:config=config/webhook
	$(MAKE) --no-print-directory chart-files
	$(MAKE) --no-print-directory api-docs

# The Helm chart's copies of generated and monitoring manifests (go test ./charts/ fails when they differ).
CHART_FILES = charts/subflow/files
.PHONY: chart-files
chart-files: ## Copy the CRD, manager role, webhook configurations and config/monitoring's rule and dashboard into the Helm chart.
	cp config/crd/bases/subflow.dev_subscriptionflows.yaml $(CHART_FILES)/crds/
	cp config/rbac/role.yaml $(CHART_FILES)/manager-role.yaml
	cp config/webhook/manifests.yaml $(CHART_FILES)/webhooks.yaml
	cp config/monitoring/prometheusrule.yaml config/monitoring/grafana-dashboard.json $(CHART_FILES)/

# The API reference, from api/v1alpha1's doc comments and markers (crd-ref-docs from go.mod, our
# templates in hack/api-docs); CI's "make manifests generate leaves no diff" keeps it current.
.PHONY: api-docs
api-docs: ## Write docs/api.md, the API reference, from the Go types in api/v1alpha1.
	$(GO) tool crd-ref-docs --log-level=WARN --renderer=markdown --source-path=./api/v1alpha1 \
		--config=hack/api-docs/config.yaml --templates-dir=hack/api-docs/templates/markdown --output-path=docs/api.md

.PHONY: generate
generate: ## Generate deepcopy code and the Pulsar wire format's protobuf code (internal/pulsarwire).
	$(CONTROLLER_GEN) object paths="./api/..."
	$(GO) generate ./internal/...

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: lint
lint: vet ## Check formatting, vet, and that the agent does not pull in controller-runtime.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	@! $(GO) list -deps ./agent/... | grep -q '^sigs.k8s.io/controller-runtime' || { echo "agent must not import controller-runtime"; exit 1; }

.PHONY: test
test: ## Run unit and envtest integration tests with -race (builds envtest binaries on first use).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(GO) test $(TEST_FLAGS) ./...

# Go fuzz targets, package:name. Each checks what a user relies on (a command read as the
# broker reads it, a cut that keeps exactly the entry's messages from the target on) and that
# no input allocates more than a stated bound; crashers go to the package's testdata/fuzz/.
FUZZ_TARGETS = ./agent/sidecar:FuzzClientFrames ./agent/sidecar:FuzzBrokerMessage \
	./agent/sidecar:FuzzCutBatch ./agent/sidecar:FuzzTranslateAck ./agent/control:FuzzDecodeFlowRequest
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Fuzz the sidecar's frame parsing both ways, its seek cut and ACK translation, and the control API's request decoding (FUZZTIME per target, default 30s).
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $${t##*:} ($(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$${t##*:}$$" -fuzztime=$(FUZZTIME) $${t%%:*}; \
	done

.PHONY: conformance
conformance: ## Run the agent's broker conformance tests (in-process pulsartest, or the broker at PULSAR_URL and PULSAR_ADMIN_URL).
	PULSAR_URL="$(PULSAR_URL)" PULSAR_ADMIN_URL="$(PULSAR_ADMIN_URL)" $(GO) test $(TEST_FLAGS) -run 'Integration' ./agent/ ./agent/internal/pulsaradmin/

# A real Apache Pulsar standalone from Maven artifacts (needs Java 17+ and Maven; hack/pulsar).
PULSAR = hack/pulsar/pulsar.sh
# The 4.0 LTS (seek resolves by binary search) and the newest release with PIP-415
# getMessageIdByIndex whose artifacts resolve here.
PULSAR_VERSIONS ?= 4.0.7 4.2.4
PULSAR_NO_INDEX_METADATA = --set brokerEntryMetadataInterceptors= --set exposingBrokerEntryMetadataToClientEnabled=false

.PHONY: pulsar
pulsar: ## Run a real Apache Pulsar standalone in the foreground (PULSAR_VERSION to pick one; Ctrl-C stops it).
	$(PULSAR) run

.PHONY: pulsar-fetch
pulsar-fetch: ## Fetch the broker jars of each of PULSAR_VERSIONS with Maven (cached in ~/.m2).
	@set -e; for v in $(PULSAR_VERSIONS); do PULSAR_VERSION=$$v $(PULSAR) classpath; done

.PHONY: pulsar-selftest
pulsar-selftest: ## Check that hack/pulsar fails fast with its reason and never leaves a JVM behind.
	hack/pulsar/selftest.sh

.PHONY: conformance-pulsar
conformance-pulsar: ## Run the conformance tests (and the test broker's differential scenarios) on real Pulsar brokers: each of PULSAR_VERSIONS, with and without index metadata.
	@set -e; for v in $(PULSAR_VERSIONS); do \
		echo "== conformance on Apache Pulsar $$v"; \
		PULSAR_VERSION=$$v $(PULSAR) exec -- sh -c '$(MAKE) --no-print-directory conformance && \
			$(GO) test $(TEST_FLAGS) -run Differential ./internal/testing/pulsartest/'; \
		echo "== test broker differential scenarios on Apache Pulsar $$v with Key_Shared hash ranges"; \
		PULSAR_VERSION=$$v $(PULSAR) exec --set subscriptionKeySharedUseConsistentHashing=false -- \
			$(GO) test $(TEST_FLAGS) -run 'Differential/KeySharedHashRanges' ./internal/testing/pulsartest/; \
		echo "== conformance on Apache Pulsar $$v without index metadata"; \
		PULSAR_VERSION=$$v $(PULSAR) exec $(PULSAR_NO_INDEX_METADATA) -- $(MAKE) --no-print-directory conformance; \
	done

.PHONY: chaos-pulsar
chaos-pulsar: ## Run the short seeded chaos run (TestShortRun) on a real Apache Pulsar of each of PULSAR_VERSIONS.
	@set -e; export KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)"; for v in $(PULSAR_VERSIONS); do \
		echo "== chaos, short run, on Apache Pulsar $$v"; \
		PULSAR_VERSION=$$v $(PULSAR) exec -- $(GO) test $(TEST_FLAGS) -run '^TestShortRun$$' ./internal/testing/chaos/; \
	done

.PHONY: demo-pulsar
demo-pulsar: ## Run the scripted walk-through on a real Apache Pulsar standalone of each of PULSAR_VERSIONS.
	@set -e; export KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)"; for v in $(PULSAR_VERSIONS); do \
		echo "== demo on Apache Pulsar $$v"; \
		PULSAR_VERSION=$$v $(PULSAR) exec -- sh -c '$(GO) run ./hack/demo --pulsar-url "$$PULSAR_URL" --admin-url "$$PULSAR_ADMIN_URL"'; \
	done

.PHONY: clients-fetch
clients-fetch: ## Install the sidecar tests' Java and Python consumer apps (pulsar-client from Maven and PyPI; cached under ~/.cache/subflow/clients).
	hack/clients/java/peer.sh --prepare
	hack/clients/python/peer.sh --prepare

.PHONY: sidecar-pulsar
sidecar-pulsar: ## Run the sidecar's tests with the Go, Java and Python consumer apps on a real Apache Pulsar of each of PULSAR_VERSIONS, and on one with token authentication.
	@set -e; for v in $(PULSAR_VERSIONS); do \
		echo "== sidecar with the Go, Java and Python clients on Apache Pulsar $$v"; \
		PULSAR_VERSION=$$v PULSAR_CLIENT_VERSION=$$v $(PULSAR) exec -- $(GO) test $(TEST_FLAGS) ./agent/sidecar/; \
	done
	@set -e; key=$$(head -c 32 /dev/urandom | base64 -w0); echo "== sidecar on Apache Pulsar with token authentication"; \
	PULSAR_TOKEN_SECRET=$$key $(PULSAR) exec --set authenticationEnabled=true \
		--set authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken \
		--set "tokenSecretKey=data:;base64,$$key" --set anonymousUserRole=anonymous \
		-- $(GO) test $(TEST_FLAGS) -run TestTokenAuth ./agent/sidecar/

.PHONY: bench
bench: ## Run the benchmarks side by side and write BENCHMARKS.md (a real Pulsar runs for the *Pulsar benchmarks; RESUME=1 keeps the packages already in bench-runs/, PKGS to run some).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(PULSAR) exec -- $(GO) run ./hack/benchreport -parts bench-runs $(if $(RESUME),-resume) $(PKGS)

.PHONY: chaos
chaos: ## Run a long seeded chaos run (SEED=n to replay; CHAOS_FLAGS for scale) and exit non-zero on any violation.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(GO) run ./hack/chaos $(if $(SEED),-seed $(SEED)) $(CHAOS_FLAGS)

.PHONY: demo
demo: ## Run the scripted walk-through on a local control plane and test broker.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(GO) run ./hack/demo

##@ Build

.PHONY: build
build: ## Build the controller, the kubectl plugin and the sidecar into bin/.
	$(GO) build -o bin/subflow .
	$(GO) build -o bin/kubectl-subflow ./cmd/kubectl-subflow
	$(GO) build -o bin/subflow-sidecar ./cmd/subflow-sidecar

.PHONY: run
run: ## Run the controller against the cluster in ~/.kube/config.
	$(GO) run . --metrics-bind-address=:8080 --metrics-secure=false --health-probe-bind-address=:8081

.PHONY: images
images: ## Build the controller, sidecar and example consumer images (no Docker daemon) as archives in dist/images (REGISTRY, TAG, ARCH).
	$(GO) run ./hack/images -registry "$(REGISTRY)" -tag $(TAG) -arch $(ARCH) -out dist/images

# A release: VERSION (x.y.z) names the images' tag, the chart's version and appVersion and the
# plugin's krew version; RELEASE_URL is where the plugin archives will be published (the krew
# manifest's uri; empty leaves bare file names, for kubectl krew install --archive).
RELEASE_DIR = dist/release

.PHONY: release
release: ## Write the release to dist/release: multi-arch controller and sidecar OCI images, the chart, the plugin for linux and darwin (amd64, arm64) with a krew manifest, SHA256SUMS (VERSION, REGISTRY, RELEASE_URL).
	@test -n "$(VERSION)" || { echo "make release needs VERSION=x.y.z"; exit 1; }
	$(GO) run ./hack/release -version $(VERSION) -registry "$(REGISTRY)" -url "$(RELEASE_URL)" -out $(RELEASE_DIR)

.PHONY: release-check
release-check: ## Check dist/release as users' tools read it: images' config and binaries per architecture, chart lint and versions, krew manifest, checksums (VERSION).
	@test -n "$(VERSION)" || { echo "make release-check needs VERSION=x.y.z"; exit 1; }
	$(GO) run ./hack/release -check -version $(VERSION) -out $(RELEASE_DIR)

.PHONY: e2e
e2e: ## Run the end-to-end suite on a real single-node Kubernetes with a real Pulsar (root; the first run builds the node's binaries and installs the runtime from Debian's packages).
	hack/e2e/run.sh

.PHONY: e2e-bench
e2e-bench: ## Measure kubectl patch -> every pod Paused on the real cluster and add it to BENCHMARKS.md (keeps the other packages' parts).
	E2E_BENCH=1 hack/e2e/run.sh

.PHONY: e2e-cluster
e2e-cluster: ## Start the end-to-end suite's cluster by hand (Ctrl-C removes it); E2E_CLEAN=1 removes what a killed run left.
	$(if $(E2E_CLEAN),$(GO) run ./hack/e2e/cluster clean,SUBFLOW_NODE_BINARIES=$$(hack/e2e/node-binaries.sh) $(GO) run ./hack/e2e/cluster up $$(ls dist/images/*.tar 2>/dev/null))

##@ Deployment

.PHONY: install
install: ## Install the CRD into the cluster in ~/.kube/config.
	kubectl apply --server-side -k config/crd

.PHONY: uninstall
uninstall: ## Delete every SubscriptionFlow (the controller releases their pods), then the CRD. FORCE=1 without a controller.
	hack/release-flows.sh
	kubectl delete -k config/crd --ignore-not-found

.PHONY: deploy
deploy: ## Deploy the controller with image IMG (or REGISTRY and TAG) and its webhooks (OVERLAY=cert-manager for cert-manager's certificates).
	cd config/manager && kubectl kustomize . >/dev/null
	kubectl kustomize config/$(OVERLAY) | sed 's#image: subflow-controller:dev#image: $(IMG)#' | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: ## Delete every SubscriptionFlow while the controller runs (it releases their pods), then the controller and the CRD.
	hack/release-flows.sh
	kubectl delete -k config/$(OVERLAY) --ignore-not-found
