package controllers

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// pushAll sends each pod's request to its agent and returns one outcome per pod, in the pods'
// order. Pods without an IP are reported unreachable at once. It waits for answers only while
// they keep coming (pushPatience), and not at all for a pod whose last push, from any flow,
// failed or was not answered in time: a push still in flight is reported as such, goes on, and
// requeues the flow when it ends; the next reconcile reports its outcome instead of pushing
// that pod again, if the request is still the same. A pod whose answer to the same request
// showed it done is not pushed to again within the resync period (a retry because of other
// pods re-pushes only those), nor within fresh: the resync period, or less when the flow's
// consumer counts are refreshed (answersFresh). A pod whose agent does not work is not pushed to until its
// backoff step has passed (podbackoff.go): it is reported with its last error, and heldUntil
// is the earliest time such a pod may be pushed again (zero if none is held).
func (r *SubscriptionFlowReconciler) pushAll(ctx context.Context, flow types.NamespacedName, pods []*corev1.Pod,
	target func(*corev1.Pod) AgentTarget, request func(pod string) protocol.FlowRequest, fresh time.Duration) (_ []podOutcome, heldUntil time.Time) {
	outcomes := make([]podOutcome, len(pods))
	jobs := make(chan pushJob, len(pods))
	ctx = context.WithoutCancel(ctx) // a push may outlive its reconcile; the agent client bounds it
	waiting := map[int]pushKey{}
	matched := make(map[string]bool, len(pods))
	now := r.wallClock().Now()
	for i := range pods {
		outcomes[i].Pod = pods[i].Name
		t := target(pods[i])
		if t.BaseURL == "" {
			continue
		}
		matched[t.Pod] = true
		key, req := pushKey{flow: flow, pod: t.Pod}, request(t.Pod)
		subject := subjectOf(pods[i], t, req)
		if o, ok := r.memory.take(key, subject, now, fresh); ok {
			outcomes[i] = o
			continue
		}
		if err, next, held := r.memory.held(subject, now); held {
			outcomes[i].Err = err
			if heldUntil.IsZero() || next.Before(heldUntil) {
				heldUntil = next
			}
			continue
		}
		if lastErr := r.memory.start(key, subject); lastErr == nil {
			waiting[i] = key
		} else {
			outcomes[i].Err = lastErr
		}
		jobs <- pushJob{i: i, key: key, subject: subject, target: t, req: req} // now: the push may outlive the reconcile and its flow object
	}
	close(jobs)
	r.memory.keepApplied(flow, matched)
	// Each answer names its pod, so that collecting it costs one lookup, not one per pod waited for.
	answered := make(chan int, len(jobs))
	for range min(r.parallelism(), len(jobs)) {
		go func() {
			for job := range jobs {
				outcome := r.pushOne(ctx, job.target, job.req)
				if r.memory.finish(job.key, job.subject, outcome, settledAnswer(job.req, outcome), r.wallClock().Now()) {
					r.wake(flow)
				}
				answered <- job.i
			}
		}()
	}
	return r.awaitAnswers(outcomes, waiting, answered), heldUntil
}

// awaitAnswers fills outcomes from the pushes waited for as they answer, until every one did
// or none has for pushPatience.
func (r *SubscriptionFlowReconciler) awaitAnswers(outcomes []podOutcome, waiting map[int]pushKey, answered <-chan int) []podOutcome {
	patience := time.NewTimer(pushPatience)
	defer patience.Stop()
	for len(waiting) > 0 {
		select {
		case i := <-answered:
			patience.Reset(pushPatience)
			if key, ok := waiting[i]; ok {
				if o, ok := r.memory.collect(key, false); ok {
					outcomes[i] = o
					delete(waiting, i)
				}
			}
		case <-patience.C:
			for i, key := range waiting {
				if o, ok := r.memory.collect(key, true); ok {
					outcomes[i] = o
				} else {
					outcomes[i].Err = &noAnswer{}
				}
			}
			return outcomes
		}
	}
	return outcomes
}

// subjectOf is what pushing req to the pod's agent at t is about (pushSubject).
func subjectOf(pod *corev1.Pod, t AgentTarget, req protocol.FlowRequest) pushSubject {
	return pushSubject{request: requestDigest(req), address: agentAddress{pod: pod.UID, url: t.BaseURL},
		restarts: restarts(pod), token: t.Token}
}

// pushJob is one pod's push, run by one of the flow's at most parallelism push workers (so a
// flow of 10 000 pods starts 64 goroutines, not 10 000).
type pushJob struct {
	i       int
	key     pushKey
	subject pushSubject
	target  AgentTarget
	req     protocol.FlowRequest
}

// pushOne pushes one request and records how it went.
func (r *SubscriptionFlowReconciler) pushOne(ctx context.Context, t AgentTarget, req protocol.FlowRequest) podOutcome {
	start := r.wallClock().Now()
	status, previousToken, err := withTokens(t, func(t AgentTarget) (protocol.FlowStatus, error) { return r.Agents.PutFlow(ctx, t, req) })
	pushDuration.Observe(r.wallClock().Since(start).Seconds())
	if err != nil {
		pushErrors.WithLabelValues(pushErrorReason(err)).Inc()
		// A pod that names no agent port is told by wiringProblems, from the pod.
		return podOutcome{Pod: t.Pod, Err: withAgentURL(err, t), PreviousToken: previousToken}
	}
	return podOutcome{Pod: t.Pod, Status: &status, PreviousToken: previousToken}
}

// withAgentURL names the agent instead of the flow's URL in a transport error: the error
// becomes the pod's suspicion, reported by every flow selecting the pod, each of which would
// otherwise name another flow's URL in its status.
func withAgentURL(err error, t AgentTarget) error {
	var urlErr *url.Error
	if !errors.As(err, &urlErr) || error(urlErr) != err {
		return err // not the transport's own error: keep what wraps it
	}
	return &url.Error{Op: urlErr.Op, URL: t.BaseURL, Err: urlErr.Err}
}

// wake requeues a flow whose late push ended. Never blocks: when the channel is full, the
// flow's retry (it is not Ready while a push is in flight) comes anyway.
func (r *SubscriptionFlowReconciler) wake(flow types.NamespacedName) {
	if r.lateAnswers == nil {
		return
	}
	select {
	case r.lateAnswers <- wakeEvent(flow):
	default:
	}
}

func wakeEvent(flow types.NamespacedName) event.GenericEvent {
	return event.GenericEvent{Object: &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: flow.Namespace, Name: flow.Name}}}
}

func pushErrorReason(err error) string {
	var agentErr *AgentError
	switch {
	case IsUnauthorized(err):
		return "Unauthorized"
	case IsStale(err):
		return "StaleRevision"
	case IsAgentTooOld(err):
		return "AgentTooOld"
	case IsTooManyFlows(err):
		return "TooManyFlows"
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

// releaseAll removes the flow's rule from every pod's agent that has an address, at most
// parallelism at a time, and returns the pods that failed. When ctx ends, the pods not yet
// asked fail with its error.
func (r *SubscriptionFlowReconciler) releaseAll(ctx context.Context, pods []*corev1.Pod, target func(*corev1.Pod) AgentTarget, uid string) []releaseFailure {
	var mu sync.Mutex
	var failed []releaseFailure
	fail := func(pod string, err error) {
		mu.Lock()
		failed = append(failed, releaseFailure{pod: pod, err: err})
		mu.Unlock()
	}
	var g errgroup.Group
	g.SetLimit(r.parallelism())
	for _, pod := range pods {
		t := target(pod)
		if t.BaseURL == "" {
			continue
		}
		if err := ctx.Err(); err != nil {
			fail(t.Pod, err) // Go waits for a slot whatever the context: one release at most
			continue
		}
		g.Go(func() error {
			_, _, err := withTokens(t, func(t AgentTarget) (struct{}, error) { return struct{}{}, r.Agents.DeleteFlow(ctx, t, uid) })
			if err != nil {
				fail(t.Pod, err)
			}
			return nil
		})
	}
	_ = g.Wait()
	return failed
}
