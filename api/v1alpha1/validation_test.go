package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

var k8s client.Client

func TestMain(m *testing.M) {
	env, cfg, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = subflowv1.AddToScheme(scheme)
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	code := 1
	if err == nil {
		code = m.Run()
	} else {
		fmt.Fprintln(os.Stderr, err)
	}
	_ = env.Stop()
	os.Exit(code)
}

func validFlow(name string) *subflowv1.SubscriptionFlow {
	index := int64(120034)
	port := intstr.FromString("subflow")
	return &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: subflowv1.SubscriptionFlowSpec{
			Selector:     metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders-worker"}},
			Subscription: "orders-ingest",
			Topic:        "persistent://shop/orders/events",
			State:        subflowv1.StatePaused,
			Seek:         &subflowv1.SeekSpec{ID: "replay-1", Index: &index},
			MaintenanceWindows: []subflowv1.MaintenanceWindow{{
				Schedule: "0 2 * * 6", Duration: metav1.Duration{Duration: 2 * time.Hour},
				TimeZone: "Europe/Berlin", State: subflowv1.StatePaused,
			}},
			Agent: subflowv1.AgentSpec{
				Port:           &port,
				TokenSecretRef: &subflowv1.SecretKeyRef{Name: "subflow-agent-token", Key: "token"},
			},
			DeletionPolicy: subflowv1.DeletionRetain,
		},
	}
}

func TestAPIServerRefusesInvalidFlows(t *testing.T) {
	negative := int64(-1)
	tests := []struct {
		name    string
		mutate  func(*subflowv1.SubscriptionFlowSpec)
		wantErr string
	}{
		{"empty subscription", func(s *subflowv1.SubscriptionFlowSpec) { s.Subscription = "" },
			"spec.subscription"},
		{"unknown state", func(s *subflowv1.SubscriptionFlowSpec) { s.State = "Sleeping" },
			`spec.state: Unsupported value: "Sleeping"`},
		{"negative index", func(s *subflowv1.SubscriptionFlowSpec) { s.Seek.Index = &negative },
			"spec.seek.index: Invalid value: -1: spec.seek.index in body should be greater than or equal to 0"},
		{"seek without id", func(s *subflowv1.SubscriptionFlowSpec) { s.Seek.ID = "" },
			"spec.seek.id"},
		{"index together with partitions", func(s *subflowv1.SubscriptionFlowSpec) {
			s.Seek.Partitions = []subflowv1.PartitionIndex{{Partition: 0, Index: 5}}
		}, "set exactly one of seek.index (non-partitioned topic) or seek.partitions"},
		{"neither index nor partitions", func(s *subflowv1.SubscriptionFlowSpec) { s.Seek.Index = nil },
			"set exactly one of seek.index (non-partitioned topic) or seek.partitions"},
		{"duplicate partition", func(s *subflowv1.SubscriptionFlowSpec) {
			s.Seek.Index = nil
			s.Seek.Partitions = []subflowv1.PartitionIndex{{Partition: 1, Index: 5}, {Partition: 1, Index: 9}}
		}, "spec.seek.partitions[1]: Duplicate value"},
		{"invalid cron", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "every saturday" },
			"schedule must be a five-field cron expression"},
		{"cron minute out of range", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "75 2 * * 6" },
			"schedule minute field must use 0-59"},
		{"cron hour out of range", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 24 * * 6" },
			"schedule hour field must use 0-23"},
		{"cron day of month out of range", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 2 0 * *" },
			"schedule day-of-month field must use 1-31"},
		{"cron month out of range", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 2 1 13 *" },
			"schedule month field must use 1-12 or jan-dec"},
		{"cron day of week 7", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 2 * * 7" },
			"schedule day-of-week field must use 0-6 or sun-sat"},
		{"cron step zero", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "*/0 2 * * *" },
			"schedule minute field must use 0-59"},
		{"30 February never fires", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 0 30 2 *" },
			"schedule never fires"},
		{"31 April never fires", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Schedule = "0 0 31 4 *" },
			"schedule never fires"},
		{"31 in short months by name never fires", func(s *subflowv1.SubscriptionFlowSpec) {
			s.MaintenanceWindows[0].Schedule = "0 0 31 Feb,apr,JUN,9,11 ?"
		},
			"schedule never fires"},
		{"duration over a week", func(s *subflowv1.SubscriptionFlowSpec) {
			s.MaintenanceWindows[0].Duration = metav1.Duration{Duration: 169 * time.Hour}
		}, "duration must be at most 168h"},
		{"unknown time zone", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].TimeZone = "Mars/Olympus_Mons" },
			"timeZone must be a known IANA time zone name such as Europe/Berlin"},
		{"zero duration", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].Duration = metav1.Duration{} },
			"duration must be greater than zero"},
		{"unknown window state", func(s *subflowv1.SubscriptionFlowSpec) { s.MaintenanceWindows[0].State = "Off" },
			`spec.maintenanceWindows[0].state: Unsupported value: "Off"`},
		{"empty selector", func(s *subflowv1.SubscriptionFlowSpec) { s.Selector = metav1.LabelSelector{} },
			"selector must not be empty: set matchLabels or matchExpressions"},
		{"partitions without topic", func(s *subflowv1.SubscriptionFlowSpec) {
			s.Topic = ""
			s.Seek.Index = nil
			s.Seek.Partitions = []subflowv1.PartitionIndex{{Partition: 0, Index: 5}}
		}, "seek.partitions needs spec.topic"},
		{"unknown deletion policy", func(s *subflowv1.SubscriptionFlowSpec) { s.DeletionPolicy = "Forget" },
			`spec.deletionPolicy: Unsupported value: "Forget"`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := validFlow(fmt.Sprintf("invalid-%d", i))
			tt.mutate(&flow.Spec)
			err := k8s.Create(context.Background(), flow)
			if err == nil {
				_ = k8s.Delete(context.Background(), flow)
				t.Fatalf("API server accepted an invalid flow (%s)", tt.name)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q\ndoes not contain %q", err, tt.wantErr)
			}
			got := &subflowv1.SubscriptionFlow{}
			if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(flow), got); err == nil {
				t.Fatalf("refused flow was stored anyway")
			}
		})
	}
}

func TestAPIServerAcceptsValidFlowAndDefaults(t *testing.T) {
	ctx := context.Background()
	flow := validFlow("valid-full")
	flow.Spec.State = ""
	flow.Spec.DeletionPolicy = ""
	flow.Spec.MaintenanceWindows = append(flow.Spec.MaintenanceWindows,
		subflowv1.MaintenanceWindow{Schedule: "@daily", Duration: metav1.Duration{Duration: 90 * time.Minute}},
		subflowv1.MaintenanceWindow{Schedule: "*/15 0-6 1,15 JAN-MAR mon-fri", Duration: metav1.Duration{Duration: time.Minute}},
		// Accepted: 29 February fires in leap years; 30 February ORed with Mondays fires on Mondays.
		subflowv1.MaintenanceWindow{Schedule: "0 0 29 2 *", Duration: metav1.Duration{Duration: 168 * time.Hour}},
		subflowv1.MaintenanceWindow{Schedule: "0 0 30 2 1", Duration: metav1.Duration{Duration: time.Hour}},
		subflowv1.MaintenanceWindow{Schedule: "0 0 31 1,4 *", Duration: metav1.Duration{Duration: time.Hour}})
	if err := k8s.Create(ctx, flow); err != nil {
		t.Fatalf("valid flow refused: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, flow) })

	got := &subflowv1.SubscriptionFlow{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(flow), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.State != subflowv1.StateRunning || got.Spec.DeletionPolicy != subflowv1.DeletionResume {
		t.Errorf("defaults: state=%q deletionPolicy=%q, want Running and Resume", got.Spec.State, got.Spec.DeletionPolicy)
	}
	if got.Spec.MaintenanceWindows[1].State != subflowv1.StatePaused {
		t.Errorf("window state default = %q, want Paused", got.Spec.MaintenanceWindows[1].State)
	}

	got.Status.Consumers = subflowv1.ConsumerCounts{Total: 2, Paused: 2, Halted: "2/2"}
	if err := k8s.Status().Update(ctx, got); err != nil {
		t.Fatalf("status subresource refused an update: %v", err)
	}
}

func TestAPIServerAcceptsSamples(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot(), "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "subflow_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples in %s (%v)", dir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(data, &obj.Object); err != nil {
				t.Fatal(err)
			}
			obj.SetNamespace("default")
			if err := k8s.Create(context.Background(), obj); err != nil {
				t.Fatalf("sample refused: %v", err)
			}
			_ = k8s.Delete(context.Background(), obj)
		})
	}
}

// A seek id names one target: changing the index (or the partitions) under the same id is
// refused with a message that says what to do, and the stored seek stays as it was; a new id
// with a new target, and dropping the seek, are accepted.
func TestAPIServerRefusesANewTargetUnderTheSameSeekID(t *testing.T) {
	ctx := context.Background()
	flow := validFlow("seek-once")
	if err := k8s.Create(ctx, flow); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, flow) })
	patch := func(p string) error {
		return k8s.Patch(ctx, flow.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(p)))
	}
	err := patch(`{"spec":{"seek":{"id":"replay-1","index":5}}}`)
	if err == nil || !strings.Contains(err.Error(), "seek.id already names a seek to another target") {
		t.Fatalf("same id, another index: %v", err)
	}
	got := &subflowv1.SubscriptionFlow{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(flow), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Seek.ID != "replay-1" || *got.Spec.Seek.Index != 120034 {
		t.Fatalf("the refused patch changed the seek: %+v", got.Spec.Seek)
	}
	if err := patch(`{"spec":{"seek":{"id":"replay-1","index":120034}}}`); err != nil {
		t.Fatalf("the same seek again: %v", err)
	}
	if err := patch(`{"spec":{"seek":{"id":"replay-2","index":5}}}`); err != nil {
		t.Fatalf("a new id with a new index: %v", err)
	}
	if err := patch(`{"spec":{"seek":null}}`); err != nil {
		t.Fatalf("dropping the seek: %v", err)
	}
}
