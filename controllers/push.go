package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// fanOut calls call for every pod that has an agent address, with at most parallelism calls in
// flight, and returns when all are done.
func (r *SubscriptionFlowReconciler) fanOut(pods []corev1.Pod, target func(*corev1.Pod) AgentTarget, call func(i int, t AgentTarget)) {
	sem := make(chan struct{}, r.parallelism())
	var wg sync.WaitGroup
	for i := range pods {
		t := target(&pods[i])
		if t.BaseURL == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			call(i, t)
		}()
	}
	wg.Wait()
}

// pushAll sends each pod's request to its agent and returns one outcome per pod, in the pods'
// order. Pods without an IP are reported unreachable at once.
func (r *SubscriptionFlowReconciler) pushAll(ctx context.Context, pods []corev1.Pod, target func(*corev1.Pod) AgentTarget,
	request func(pod string) protocol.FlowRequest) []podOutcome {
	outcomes := make([]podOutcome, len(pods))
	for i := range pods {
		outcomes[i].Pod = pods[i].Name
	}
	r.fanOut(pods, target, func(i int, t AgentTarget) {
		start := time.Now()
		status, err := r.Agents.PutFlow(ctx, t, request(t.Pod))
		pushDuration.Observe(time.Since(start).Seconds())
		if err != nil {
			pushErrors.WithLabelValues(pushErrorReason(err)).Inc()
			outcomes[i].Err = err
			return
		}
		outcomes[i].Status = &status
	})
	return outcomes
}

func pushErrorReason(err error) string {
	var agentErr *AgentError
	switch {
	case IsUnauthorized(err):
		return "Unauthorized"
	case IsStale(err):
		return "StaleRevision"
	case errors.As(err, &agentErr):
		return "Rejected"
	default:
		return "Unreachable"
	}
}

// releaseFailure is a pod whose agent could not be told to release a rule.
type releaseFailure struct {
	pod string
	err error
}

func (f releaseFailure) String() string { return f.pod + " (" + f.err.Error() + ")" }

// releaseAll removes the flow's rule from every pod's agent; it returns the pods that failed.
// A pod without an address cannot be reached and counts as failed.
func (r *SubscriptionFlowReconciler) releaseAll(ctx context.Context, pods []corev1.Pod, target func(*corev1.Pod) AgentTarget, uid string) []releaseFailure {
	var mu sync.Mutex
	var failed []releaseFailure
	r.fanOut(pods, target, func(_ int, t AgentTarget) {
		if err := r.Agents.DeleteFlow(ctx, t, uid); err != nil {
			mu.Lock()
			failed = append(failed, releaseFailure{pod: t.Pod, err: err})
			mu.Unlock()
		}
	})
	return failed
}
