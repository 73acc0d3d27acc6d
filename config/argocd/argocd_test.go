package argocd

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite argocd-cm-patch.yaml from the Lua scripts")

// TestHealthOfFixtures: what Argo CD shows for each flow in testdata, and what kstatus (Flux's
// wait and healthChecks) computes for the same object, as README.md says.
func TestHealthOfFixtures(t *testing.T) {
	tests := []struct {
		fixture string
		health  string
		message string // part of the message
		kstatus status.Status
	}{
		// kstatus reads a flow without status as Current: it has nothing to wait for.
		{"fresh.yaml", "Progressing", "Waiting for the controller to report the flow", status.CurrentStatus},
		{"not-observed.yaml", "Progressing", "observe generation 4 (status describes generation 3)", status.InProgressStatus},
		{"running.yaml", "Healthy", "3 agents applied revision 3: 6 consumers Running", status.CurrentStatus},
		{"paused-spec.yaml", "Healthy", "Paused by spec.state: 6/6 consumers paused or stopped", status.CurrentStatus},
		{"stopped-spec.yaml", "Healthy", "Stopped by spec.state: 6/6 consumers", status.CurrentStatus},
		{"paused-window.yaml", "Healthy", "Paused by a maintenance window: 6/6 consumers paused or stopped (Paused, from Window) (the window ends at 2026-12-05T03:00:00Z)", status.CurrentStatus},
		{"autopaused.yaml", "Healthy", "Paused by spec.pauseWhen: orders-db-down: Deployment orders-db has Available=False", status.CurrentStatus},
		{"paused-override.yaml", "Suspended", "Paused by the override annotation subflow.dev/override-state: 6/6 consumers paused or stopped (Paused, from Override: INC-4711) (the override ends at 2026-12-01T11:00:00Z)", status.CurrentStatus},
		{"pausing.yaml", "Progressing", "Consumers not yet Paused: orders-worker-2/c0", status.InProgressStatus},
		{"stalled.yaml", "Degraded", "tokenSecretRef names Secret shop/orders-token, which does not exist", status.FailedStatus},
		{"agent-too-old.yaml", "Degraded", "1 of 3 agents are too old for revision 4", status.InProgressStatus},
		{"held-by-other-flow.yaml", "Suspended", "held by flow shop/orders-all (Paused)", status.InProgressStatus},
		{"backlog-at-risk.yaml", "Degraded", "deletes waiting messages in 12m", status.CurrentStatus},
		{"seek-failed.yaml", "Degraded", "Seek replay-1 failed on orders-worker-0: IndexMetadataDisabled", status.CurrentStatus},
		{"seek-pending.yaml", "Progressing", "Seek replay-1 pending on orders-worker-0", status.CurrentStatus},
		{"deleting.yaml", "Progressing", "Deleting: the controller releases the agents' rule first", status.TerminatingStatus},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.fixture] = true
		t.Run(tt.fixture, func(t *testing.T) {
			obj := loadFixture(t, tt.fixture)
			got, message := health(t, obj)
			if got != tt.health || !strings.Contains(message, tt.message) {
				t.Errorf("health = %s %q, want %s with %q", got, message, tt.health, tt.message)
			}
			res, err := status.Compute(&unstructured.Unstructured{Object: obj})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tt.kstatus {
				t.Errorf("kstatus = %s (%s), want %s", res.Status, res.Message, tt.kstatus)
			}
		})
	}
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !seen[e.Name()] {
			t.Errorf("testdata/%s is not checked", e.Name())
		}
	}
}

// flow is a Running flow of generation 2 that the controller reported Ready, as the base of the
// generated cases.
func flow() *subflowv1.SubscriptionFlow {
	f := &subflowv1.SubscriptionFlow{
		TypeMeta:   metav1.TypeMeta{APIVersion: subflowv1.GroupVersion.String(), Kind: "SubscriptionFlow"},
		ObjectMeta: metav1.ObjectMeta{Name: "orders-ingest", Namespace: "shop", Generation: 2},
		Spec: subflowv1.SubscriptionFlowSpec{Subscription: "orders-ingest",
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders-worker"}}},
		Status: subflowv1.SubscriptionFlowStatus{ObservedGeneration: 2, Revision: 3,
			EffectiveState: subflowv1.StateRunning, StateSource: subflowv1.SourceSpec},
	}
	set(f, subflowv1.ConditionReady, metav1.ConditionTrue, subflowv1.ReasonSynced)
	return f
}

// set puts a condition on the flow with a message naming it, as the controller's setCondition
// does: Reconciling and Stalled only while True.
func set(f *subflowv1.SubscriptionFlow, condType string, st metav1.ConditionStatus, reason string) {
	f.Status.Conditions = slices.DeleteFunc(f.Status.Conditions, func(c metav1.Condition) bool { return c.Type == condType })
	if st != metav1.ConditionTrue && (condType == subflowv1.ConditionReconciling || condType == subflowv1.ConditionStalled) {
		return
	}
	f.Status.Conditions = append(f.Status.Conditions, metav1.Condition{Type: condType, Status: st, Reason: reason,
		Message: condType + " " + reason, ObservedGeneration: f.Status.ObservedGeneration,
		LastTransitionTime: metav1.Unix(1764583200, 0)})
}

func healthOf(t *testing.T, f *subflowv1.SubscriptionFlow) (string, string) {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
	if err != nil {
		t.Fatal(err)
	}
	return health(t, obj)
}

// halted makes the base flow's effective state Paused, decided by source, and reached.
func halted(f *subflowv1.SubscriptionFlow, source subflowv1.StateSource) {
	f.Status.EffectiveState, f.Status.StateSource = subflowv1.StatePaused, source
	set(f, subflowv1.ConditionPaused, metav1.ConditionTrue, subflowv1.ReasonConsumersPaused)
}

// notReady makes the base flow Ready=False with reason, as readiness returns it; the controller
// stalls on the reasons only a person can fix and is reconciling otherwise.
func notReady(f *subflowv1.SubscriptionFlow, reason string) {
	set(f, subflowv1.ConditionReady, metav1.ConditionFalse, reason)
	stalled := reason == subflowv1.ReasonAgentAuthFailed || reason == subflowv1.ReasonInvalidSpec
	if stalled {
		set(f, subflowv1.ConditionStalled, metav1.ConditionTrue, reason)
	} else {
		set(f, subflowv1.ConditionReconciling, metav1.ConditionTrue, subflowv1.ReasonProgressing)
	}
}

// reasonCases is the health each reason of api/v1alpha1 leads to, on the condition it explains,
// with the status the controller gives it. A reason the API adds fails
// TestEveryReasonHasADeliberateHealth until it is placed here.
var reasonCases = map[string]struct {
	apply  func(*subflowv1.SubscriptionFlow)
	health string
}{
	// Ready=True: the flow reached the state its spec declares.
	subflowv1.ReasonSynced: {func(f *subflowv1.SubscriptionFlow) {}, "Healthy"},
	subflowv1.ReasonNoMatchingPods: {func(f *subflowv1.SubscriptionFlow) {
		set(f, subflowv1.ConditionReady, metav1.ConditionTrue, subflowv1.ReasonNoMatchingPods)
	}, "Healthy"},
	// Ready=False while the controller drives agents: it may resolve by itself.
	subflowv1.ReasonAgentsUnreachable:   {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonAgentsUnreachable) }, "Progressing"},
	subflowv1.ReasonConsumersConverging: {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonConsumersConverging) }, "Progressing"},
	subflowv1.ReasonReleasePending:      {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonReleasePending) }, "Progressing"},
	subflowv1.ReasonNoMatchingConsumers: {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonNoMatchingConsumers) }, "Progressing"},
	subflowv1.ReasonProgressing:         {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonConsumersConverging) }, "Progressing"},
	// Another rule holds the consumers more restrictively: halted by something Git does not declare here.
	subflowv1.ReasonHeldByOtherRule: {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonHeldByOtherRule) }, "Suspended"},
	// A person must act: the controller stalled, or agents refused the revision and changed nothing.
	subflowv1.ReasonInvalidSpec:     {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonInvalidSpec) }, "Degraded"},
	subflowv1.ReasonAgentAuthFailed: {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonAgentAuthFailed) }, "Degraded"},
	subflowv1.ReasonAgentTooOld:     {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonAgentTooOld) }, "Degraded"},
	subflowv1.ReasonTooManyFlows:    {func(f *subflowv1.SubscriptionFlow) { notReady(f, subflowv1.ReasonTooManyFlows) }, "Degraded"},
	// Paused tells what Ready already told.
	subflowv1.ReasonConsumersPaused: {func(f *subflowv1.SubscriptionFlow) { halted(f, subflowv1.SourceSpec) }, "Healthy"},
	subflowv1.ReasonRunning: {func(f *subflowv1.SubscriptionFlow) {
		set(f, subflowv1.ConditionPaused, metav1.ConditionFalse, subflowv1.ReasonRunning)
	}, "Healthy"},
	subflowv1.ReasonPausePending: {func(f *subflowv1.SubscriptionFlow) {
		f.Status.EffectiveState = subflowv1.StatePaused
		notReady(f, subflowv1.ReasonConsumersConverging)
		set(f, subflowv1.ConditionPaused, metav1.ConditionFalse, subflowv1.ReasonPausePending)
	}, "Progressing"},
	// A seek is declared in Git: pending is progress, any finished failure needs a new seek id.
	subflowv1.ReasonSeekSucceeded: {seek(metav1.ConditionTrue, subflowv1.ReasonSeekSucceeded), "Healthy"},
	subflowv1.ReasonSeekPending:   {seek(metav1.ConditionFalse, subflowv1.ReasonSeekPending), "Progressing"},
	subflowv1.ReasonSeekFailed:    {seek(metav1.ConditionFalse, subflowv1.ReasonSeekFailed), "Degraded"},
	subflowv1.ReasonSeekPartiallyApplied: {seek(metav1.ConditionFalse, subflowv1.ReasonSeekPartiallyApplied),
		"Degraded"},
	subflowv1.ReasonSeekIDReused:          {seek(metav1.ConditionFalse, subflowv1.ReasonSeekIDReused), "Degraded"},
	subflowv1.ReasonIndexMetadataDisabled: {seek(metav1.ConditionFalse, subflowv1.ReasonIndexMetadataDisabled), "Degraded"},
	// Retention deleting waiting messages of a halted flow is the loss a pause must not cause.
	subflowv1.ReasonRetentionDeletesBacklog: {backlog(metav1.ConditionTrue, subflowv1.ReasonRetentionDeletesBacklog), "Degraded"},
	subflowv1.ReasonBacklogSafe:             {backlog(metav1.ConditionFalse, subflowv1.ReasonBacklogSafe), "Healthy"},
	subflowv1.ReasonBacklogUnknown:          {backlog(metav1.ConditionUnknown, subflowv1.ReasonBacklogUnknown), "Healthy"},
	// spec.pauseWhen is declared in Git: a condition that holds pauses the flow as declared.
	subflowv1.ReasonConditionHolds: {func(f *subflowv1.SubscriptionFlow) {
		halted(f, subflowv1.SourceCondition)
		set(f, subflowv1.ConditionAutoPaused, metav1.ConditionTrue, subflowv1.ReasonConditionHolds)
	}, "Healthy"},
	subflowv1.ReasonNoConditionHolds: {func(f *subflowv1.SubscriptionFlow) {
		set(f, subflowv1.ConditionAutoPaused, metav1.ConditionFalse, subflowv1.ReasonNoConditionHolds)
	}, "Healthy"},
}

func seek(st metav1.ConditionStatus, reason string) func(*subflowv1.SubscriptionFlow) {
	return func(f *subflowv1.SubscriptionFlow) { set(f, subflowv1.ConditionSeekCompleted, st, reason) }
}

func backlog(st metav1.ConditionStatus, reason string) func(*subflowv1.SubscriptionFlow) {
	return func(f *subflowv1.SubscriptionFlow) {
		halted(f, subflowv1.SourceSpec)
		set(f, subflowv1.ConditionBacklogAtRisk, st, reason)
	}
}

// TestEveryReasonHasADeliberateHealth: each reason constant of api/v1alpha1, on the condition it
// explains, gives the health reasonCases says, with that condition's message.
func TestEveryReasonHasADeliberateHealth(t *testing.T) {
	reasons := apiConstants(t, "Reason")
	for name, value := range reasons {
		c, ok := reasonCases[value]
		if !ok {
			t.Errorf("%s (%q) has no case in reasonCases: decide what Argo CD shows for it, in health.lua and here", name, value)
			continue
		}
		f := flow()
		c.apply(f)
		got, message := healthOf(t, f)
		if got != c.health {
			t.Errorf("%s: health %s (%q), want %s", name, got, message, c.health)
		}
		if decided := c.health == "Degraded" || c.health == "Suspended"; message == "" || decided && !strings.Contains(message, " "+value) {
			t.Errorf("%s: message %q does not carry the message of the condition that decided", name, message)
		}
	}
	for value := range reasonCases {
		if !slices.Contains(slices.Collect(maps.Values(reasons)), value) {
			t.Errorf("reasonCases has %q, which api/v1alpha1 no longer declares", value)
		}
	}
}

// TestReadyReasonsAreTheControllers: the reasons readiness (controllers/subscriptionflow_status.go)
// gives Ready are the ones health.lua maps by name; a new one fails here until it is mapped.
func TestReadyReasonsAreTheControllers(t *testing.T) {
	mapped := []string{subflowv1.ReasonSynced, subflowv1.ReasonNoMatchingPods, subflowv1.ReasonInvalidSpec,
		subflowv1.ReasonAgentAuthFailed, subflowv1.ReasonAgentTooOld, subflowv1.ReasonTooManyFlows,
		subflowv1.ReasonHeldByOtherRule, subflowv1.ReasonAgentsUnreachable, subflowv1.ReasonConsumersConverging,
		subflowv1.ReasonReleasePending, subflowv1.ReasonNoMatchingConsumers}
	reasons := apiConstants(t, "Reason")
	var used []string
	for _, name := range reasonsUsedBy(t, "../../controllers/subscriptionflow_status.go", "readiness") {
		used = append(used, reasons[name])
	}
	slices.Sort(used)
	slices.Sort(mapped)
	if !slices.Equal(slices.Compact(used), mapped) {
		t.Errorf("readiness gives Ready the reasons %v; health.lua maps %v", used, mapped)
	}
	lua := readFile(t, "health.lua")
	for _, r := range mapped {
		if r != subflowv1.ReasonSynced && r != subflowv1.ReasonNoMatchingPods && !strings.Contains(lua, "  "+r+" = ") {
			t.Errorf("health.lua's notReady has no entry for %s", r)
		}
	}
}

// TestEveryConditionTypeIsKnown: health.lua reads Ready, Stalled, Paused, AutoPaused, SeekCompleted
// and BacklogAtRisk, and leaves Reconciling to Ready; a new condition type needs a decision.
func TestEveryConditionTypeIsKnown(t *testing.T) {
	known := []string{"AutoPaused", "BacklogAtRisk", "Paused", "Ready", "Reconciling", "SeekCompleted", "Stalled"}
	for name, value := range apiConstants(t, "Condition") {
		if !slices.Contains(known, value) {
			t.Errorf("%s (%q): decide how health.lua reads it", name, value)
		}
	}
}

// TestPausedBySource: a flow halted by what its spec declares is Healthy - spec.state, a window,
// a pauseWhen condition - and Suspended when the on-call override halts it. Argo CD finishes a
// sync of several waves only once each resource is Healthy (or fails it on Degraded), so a flow
// Suspended as Git declares it would hold every such sync.
func TestPausedBySource(t *testing.T) {
	want := map[string]string{"Spec": "Healthy", "Window": "Healthy", "Condition": "Healthy", "Override": "Suspended"}
	sources := apiConstants(t, "Source")
	if len(sources) != len(want) {
		t.Errorf("api/v1alpha1 declares the state sources %v; decide the health of each", slices.Sorted(maps.Values(sources)))
	}
	for _, source := range sources {
		for _, state := range []subflowv1.FlowState{subflowv1.StatePaused, subflowv1.StateStopped} {
			f := flow()
			halted(f, subflowv1.StateSource(source))
			f.Status.EffectiveState = state
			got, message := healthOf(t, f)
			if got != want[source] || !strings.HasPrefix(message, string(state)+" by ") {
				t.Errorf("%s by %s: %s %q, want %s", state, source, got, message, want[source])
			}
		}
		f := flow()
		f.Status.StateSource = subflowv1.StateSource(source)
		if got, message := healthOf(t, f); got != "Healthy" {
			t.Errorf("Running by %s: %s %q, want Healthy", source, got, message)
		}
	}
}

// TestStatusOfAnotherGeneration: whatever an old status said, a generation the controller has not
// reported yet is Progressing - Degraded and Healthy alike are about the spec before.
func TestStatusOfAnotherGeneration(t *testing.T) {
	for _, reason := range []string{subflowv1.ReasonSynced, subflowv1.ReasonInvalidSpec} {
		f := flow()
		if reason != subflowv1.ReasonSynced {
			notReady(f, reason)
		}
		f.Generation = 3
		if got, message := healthOf(t, f); got != "Progressing" || !strings.Contains(message, "generation 3") {
			t.Errorf("%s at generation 2 of 3: %s %q, want Progressing", reason, got, message)
		}
	}
}

// apiConstants returns the string constants of api/v1alpha1 whose names start with prefix, by name.
// A constant may be one of agent/protocol's (the seek reasons an agent reports are declared there).
func apiConstants(t *testing.T, prefix string) map[string]string {
	t.Helper()
	protocolConsts := stringConstants(t, "../../agent/protocol", "", nil)
	out := stringConstants(t, "../../api/v1alpha1", prefix, map[string]map[string]string{"protocol": protocolConsts})
	if len(out) == 0 {
		t.Fatalf("no %s constants in api/v1alpha1", prefix)
	}
	return out
}

// stringConstants returns the string constants declared in dir whose names start with prefix:
// string literals, or constants of the packages given by their local names (imports[pkg][name]).
func stringConstants(t *testing.T, dir, prefix string, imports map[string]map[string]string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, dir+"/"+e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					switch v := vs.Values[i].(type) {
					case *ast.BasicLit:
						if v.Kind == token.STRING {
							out[name.Name], _ = strconv.Unquote(v.Value)
						}
					case *ast.SelectorExpr:
						if pkg, ok := v.X.(*ast.Ident); ok {
							if value, ok := imports[pkg.Name][v.Sel.Name]; ok {
								out[name.Name] = value
							}
						}
					}
				}
			}
		}
	}
	return out
}

// reasonsUsedBy names the subflowv1.Reason* constants the function fn in path refers to.
func reasonsUsedBy(t *testing.T, path, fn string) []string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, decl := range file.Decls {
		if fd, ok := decl.(*ast.FuncDecl); ok && fd.Name.Name == fn {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && strings.HasPrefix(sel.Sel.Name, "Reason") {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "subflowv1" {
						names = append(names, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no function %s naming reasons", path, fn)
	}
	return names
}

// TestDiscoveryOffersWhatChangesSpecState: pause, resume and stop are offered when they change
// spec.state; resume only when the flow is Paused or Stopped (no spec.state is Running).
func TestDiscoveryOffersWhatChangesSpecState(t *testing.T) {
	tests := []struct {
		state               string // "" leaves spec.state out
		pause, resume, stop bool   // disabled
	}{
		{"", false, true, false},
		{"Running", false, true, false},
		{"Paused", true, false, false},
		{"Stopped", false, false, true},
	}
	for _, tt := range tests {
		obj := loadFixture(t, "running.yaml")
		spec := obj["spec"].(map[string]any)
		delete(spec, "state")
		if tt.state != "" {
			spec["state"] = tt.state
		}
		out, ok := runLua(t, readFile(t, "actions/discovery.lua"), obj).(map[string]any)
		if !ok || len(out) != 3 {
			t.Fatalf("state %q: discovery returned %v, want pause, resume and stop", tt.state, out)
		}
		for name, disabled := range map[string]bool{"pause": tt.pause, "resume": tt.resume, "stop": tt.stop} {
			action, _ := out[name].(map[string]any)
			if action["disabled"] != disabled {
				t.Errorf("state %q: %s disabled = %v, want %v", tt.state, name, action["disabled"], disabled)
			}
			if _, err := os.Stat("actions/" + name + "/action.lua"); err != nil {
				t.Errorf("discovery offers %s, which has no action.lua: %v", name, err)
			}
		}
	}
}

// TestActionsSetSpecStateOnly: each action returns the object with spec.state set and every other
// field as it was - including status, annotations, windows and conditions.
func TestActionsSetSpecStateOnly(t *testing.T) {
	for action, state := range map[string]string{"pause": "Paused", "resume": "Running", "stop": "Stopped"} {
		for _, fixture := range []string{"autopaused.yaml", "paused-override.yaml", "paused-window.yaml", "fresh.yaml"} {
			obj := loadFixture(t, fixture)
			want := jsonRoundTrip(t, obj)
			want["spec"].(map[string]any)["state"] = state
			got := runLua(t, readFile(t, "actions/"+action+"/action.lua"), obj)
			if !reflect.DeepEqual(jsonRoundTrip(t, got), want) {
				t.Errorf("%s on %s returned\n%v\nwant\n%v", action, fixture, got, want)
			}
		}
	}
}

// jsonRoundTrip compares objects as Argo CD patches them: numbers as JSON numbers.
func jsonRoundTrip(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := yaml.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConfigMapPatchCarriesTheScripts: argocd-cm-patch.yaml holds exactly the Lua files, under the
// keys Argo CD reads; `go test ./config/argocd -update` rewrites it after a script changed.
func TestConfigMapPatchCarriesTheScripts(t *testing.T) {
	want := configMapPatch(t)
	if *update {
		if err := os.WriteFile("argocd-cm-patch.yaml", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := readFile(t, "argocd-cm-patch.yaml"); got != want {
		t.Fatalf("argocd-cm-patch.yaml differs from the Lua files: run go test ./config/argocd -update")
	}
	var patch struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   map[string]string `json:"metadata"`
		Data       map[string]string `json:"data"`
	}
	if err := yaml.UnmarshalStrict([]byte(want), &patch); err != nil {
		t.Fatal(err)
	}
	if patch.APIVersion != "v1" || patch.Kind != "ConfigMap" || patch.Metadata["name"] != "argocd-cm" || len(patch.Data) != 2 {
		t.Errorf("argocd-cm-patch.yaml patches %s %s %v with %d keys, want ConfigMap argocd-cm with 2", patch.APIVersion,
			patch.Kind, patch.Metadata, len(patch.Data))
	}
	if patch.Data[healthKey] != readFile(t, "health.lua") {
		t.Errorf("%s is not health.lua", healthKey)
	}
	var actions struct {
		Discovery   string `json:"discovery.lua"`
		Definitions []struct {
			Name   string `json:"name"`
			Action string `json:"action.lua"`
		} `json:"definitions"`
	}
	if err := yaml.UnmarshalStrict([]byte(patch.Data[actionsKey]), &actions); err != nil {
		t.Fatalf("%s: %v", actionsKey, err)
	}
	if actions.Discovery != readFile(t, "actions/discovery.lua") || len(actions.Definitions) != len(actionNames) {
		t.Fatalf("%s does not carry discovery.lua and %v", actionsKey, actionNames)
	}
	for i, d := range actions.Definitions {
		if d.Name != actionNames[i] || d.Action != readFile(t, "actions/"+d.Name+"/action.lua") {
			t.Errorf("%s definition %d is not actions/%s/action.lua", actionsKey, i, actionNames[i])
		}
	}
}

const (
	healthKey  = "resource.customizations.health.subflow.dev_SubscriptionFlow"
	actionsKey = "resource.customizations.actions.subflow.dev_SubscriptionFlow"
)

var actionNames = []string{"pause", "resume", "stop"}

// configMapPatch is argocd-cm-patch.yaml as the Lua files make it.
func configMapPatch(t *testing.T) string {
	var b strings.Builder
	b.WriteString("# The Argo CD health check and resource actions of SubscriptionFlow (config/argocd/README.md).\n" +
		"# Generated from config/argocd/*.lua by `go test ./config/argocd -update`. Apply with:\n" +
		"#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file argocd-cm-patch.yaml\n" +
		"# or list it under patches: in the kustomization that installs Argo CD.\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\ndata:\n")
	b.WriteString("  " + healthKey + ": |\n")
	b.WriteString(indent(readFile(t, "health.lua"), 4))
	b.WriteString("  " + actionsKey + ": |\n    discovery.lua: |\n")
	b.WriteString(indent(readFile(t, "actions/discovery.lua"), 6))
	b.WriteString("    definitions:\n")
	for _, name := range actionNames {
		b.WriteString("    - name: " + name + "\n      action.lua: |\n")
		b.WriteString(indent(readFile(t, "actions/"+name+"/action.lua"), 8))
	}
	return b.String()
}

func indent(text string, n int) string {
	pad := strings.Repeat(" ", n)
	var b strings.Builder
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString(pad)
		}
		b.WriteString(line)
	}
	return b.String()
}

// TestPatchMergesIntoArgoCDsConfigMap: listed under patches: of the kustomization that installs
// Argo CD, the patch adds both keys to argocd-cm and keeps the keys already there.
func TestPatchMergesIntoArgoCDsConfigMap(t *testing.T) {
	fs := filesys.MakeFsInMemory()
	files := map[string]string{
		"/app/kustomization.yaml": "namespace: argocd\nresources:\n- argocd-cm.yaml\npatches:\n- path: argocd-cm-patch.yaml\n",
		"/app/argocd-cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\n" +
			"data:\n  timeout.reconciliation: 180s\n",
		"/app/argocd-cm-patch.yaml": readFile(t, "argocd-cm-patch.yaml"),
	}
	for name, content := range files {
		if err := fs.WriteFile(name, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/app")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resources.Resources()); n != 1 {
		t.Fatalf("kustomize rendered %d objects, want argocd-cm", n)
	}
	data := resources.Resources()[0].GetDataMap()
	if data["timeout.reconciliation"] != "180s" || data[healthKey] != readFile(t, "health.lua") || data[actionsKey] == "" {
		t.Errorf("argocd-cm after the patch has keys %v, want timeout.reconciliation kept and both scripts added",
			slices.Sorted(maps.Keys(data)))
	}
}

// TestHealthToleratesMissingFields: a status with fields left out (no messages, no generation, no
// effective state) still yields a health, never a script error that Argo CD would show as Unknown.
func TestHealthToleratesMissingFields(t *testing.T) {
	for _, reason := range slices.Sorted(maps.Keys(reasonCases)) {
		for _, dropState := range []bool{false, true} {
			f := flow()
			reasonCases[reason].apply(f)
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
			if err != nil {
				t.Fatal(err)
			}
			unstructured.RemoveNestedField(obj, "metadata", "generation")
			if dropState {
				unstructured.RemoveNestedField(obj, "status", "effectiveState")
				unstructured.RemoveNestedField(obj, "status", "stateSource")
			}
			dropMessages(t, obj)
			health(t, obj)
		}
	}
}

func dropMessages(t *testing.T, obj map[string]any) {
	t.Helper()
	conditions, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conditions {
		delete(c.(map[string]any), "message")
	}
	if err := unstructured.SetNestedSlice(obj, conditions, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
}
