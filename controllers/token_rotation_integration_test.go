package controllers_test

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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

// rotatingPod is a simulated pod whose agent reads its token from a file, as from a mounted
// Secret, and the delay after a rotation at which its kubelet rewrites that file.
type rotatingPod struct {
	*podsim.Pod
	file  string
	delay time.Duration // negative: never (a subPath mount)
}

func startRotatingPod(t *testing.T, ns, name, topic string, delay time.Duration) rotatingPod {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	writeToken(t, file, testToken)
	p := startPodWith(t, ns, podsim.Options{Name: name, TokenFile: file, Topic: topic})
	return rotatingPod{Pod: p, file: file, delay: delay}
}

func writeToken(t *testing.T, file, token string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
}

func rotateSecret(t *testing.T, ns, token string) {
	t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controllers.DefaultTokenSecret}}
	patch := fmt.Sprintf(`{"stringData":{%q:%q}}`, controllers.DefaultTokenKey, token)
	if err := k8s.Patch(context.Background(), secret, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// A routine token rotation, with kubelets updating the pods' copies 0 to 90 s after it (and one
// pod, mounting with subPath, never): every state change asked during the rotation reaches
// every pod at once, the status says which agents still accept only the previous token, and
// once the grace is over the one pod left behind is named with advice that fits.
func TestIntegrationTokenRotationNeverDelaysAPause(t *testing.T) {
	ns := namespace(t, true)
	topic := "rotation-" + ns
	delays := []time.Duration{0, 15 * time.Second, 30 * time.Second, 45 * time.Second, 60 * time.Second,
		75 * time.Second, 90 * time.Second, -1}
	var pods []rotatingPod
	for i, d := range delays {
		pods = append(pods, startRotatingPod(t, ns, fmt.Sprintf("worker-%d", i), topic, d))
	}
	flow := newFlow(ns, "rotation", topic, subflowv1.StateRunning)
	create(t, flow)
	waitFlow(t, flow, "Ready before the rotation", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionReady) && int(f.Status.Consumers.Running) == len(pods)
	})

	rotatedAt := time.Now()
	clock.SetTime(rotatedAt)
	defer clock.SetTime(time.Now())
	rotateSecret(t, ns, "rotated-token")
	state := subflowv1.StateRunning
	for _, step := range append([]time.Duration{0}, delays[1:len(delays)-1]...) {
		clock.SetTime(rotatedAt.Add(step))
		var stale []string
		for _, p := range pods {
			if p.delay >= 0 && p.delay <= step {
				writeToken(t, p.file, "rotated-token")
			} else {
				stale = append(stale, p.Name)
			}
		}
		state = map[subflowv1.FlowState]subflowv1.FlowState{subflowv1.StateRunning: subflowv1.StatePaused,
			subflowv1.StatePaused: subflowv1.StateRunning}[state]
		patchFlow(t, flow, fmt.Sprintf(`{"spec":{"state":%q}}`, state))
		eventually(t, fmt.Sprintf("every pod %s %v after the rotation", state, step), func() bool {
			for _, p := range pods {
				if string(p.Consumer.State()) != string(state) {
					return false
				}
			}
			return true
		})
		got := waitFlow(t, flow, "Ready naming the agents on the previous token", func(f *subflowv1.SubscriptionFlow) bool {
			return current(f) && isTrue(f, subflowv1.ConditionReady)
		})
		ready := condition(got, subflowv1.ConditionReady).Message
		if !strings.Contains(ready, "token rotation in progress: agents in "+strings.Join(stale, ", ")+" still accept only the previous token") {
			t.Fatalf("%v after the rotation, Ready says %q; want the rotation named with %v", step, ready, stale)
		}
	}

	// The grace is over: the pod whose copy never changes is refused, and told why.
	clock.SetTime(rotatedAt.Add(controllers.DefaultTokenRotationGrace + time.Second))
	poke(t, flow)
	got := waitFlow(t, flow, "the pod left behind named", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionStalled)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == subflowv1.ReasonAgentAuthFailed
	})
	msg := condition(got, subflowv1.ConditionStalled).Message
	if !strings.Contains(msg, "Agents in worker-7 still refuse the token") || !strings.Contains(msg, "subPath") {
		t.Fatalf("Stalled says %q", msg)
	}
	if pods[len(pods)-1].Consumer.State() != protocol.State(state) {
		t.Fatalf("the pod left behind is %s, want %s as last applied", pods[len(pods)-1].Consumer.State(), state)
	}
}
