package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// pushAll sends req to every pod's agent with at most parallel calls in flight and returns one
// outcome per pod, in the pods' order. Pods without an IP are reported unreachable at once.
func (r *SubscriptionFlowReconciler) pushAll(ctx context.Context, pods []corev1.Pod, target func(*corev1.Pod) AgentTarget,
	request func(pod string) protocol.FlowRequest) []podOutcome {
	outcomes := make([]podOutcome, len(pods))
	sem := make(chan struct{}, r.parallelism())
	var wg sync.WaitGroup
	for i := range pods {
		pod := &pods[i]
		outcomes[i].Pod = pod.Name
		t := target(pod)
		if t.BaseURL == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			start := time.Now()
			status, err := r.Agents.PutFlow(ctx, t, request(pod.Name))
			pushDuration.Observe(time.Since(start).Seconds())
			if err != nil {
				pushErrors.WithLabelValues(pushErrorReason(err)).Inc()
				outcomes[i].Err = err
				return
			}
			outcomes[i].Status = &status
		}()
	}
	wg.Wait()
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

// releaseAll removes the flow's rule from every pod's agent; it returns the pods that failed.
func (r *SubscriptionFlowReconciler) releaseAll(ctx context.Context, pods []corev1.Pod, target func(*corev1.Pod) AgentTarget, uid string) []string {
	var mu sync.Mutex
	var failed []string
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
			if err := r.Agents.DeleteFlow(ctx, t, uid); err != nil {
				mu.Lock()
				failed = append(failed, t.Pod+" ("+err.Error()+")")
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}
