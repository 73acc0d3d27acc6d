package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

const flowName = "orders-ingest"

// demo runs the walk-through steps against the world and prints the live table.
type demo struct {
	w         *world
	lastCount map[string]int
	lastTime  time.Time
}

func (d *demo) flowKey() client.ObjectKey {
	return client.ObjectKey{Namespace: namespace, Name: flowName}
}

func (d *demo) createFlow(ctx context.Context) error {
	flow := &subflowv1.SubscriptionFlow{
		// Labelled as the README's example, whose fleet switch selects db=orders.
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: flowName, Labels: map[string]string{"db": "orders"}},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders-worker"}},
			Subscription: subscription, Topic: d.w.topic, State: subflowv1.StateRunning},
	}
	if err := d.w.k8s.Create(ctx, flow); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "Ready with every consumer Running", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && f.Status.Consumers.Running == int32(len(d.w.pods))
	}); err != nil {
		return err
	}
	return d.watch(ctx, 2*time.Second, func() error {
		if d.w.delivered() == 0 {
			return fmt.Errorf("no message reached the pods while Running")
		}
		return nil
	})
}

func (d *demo) pause(ctx context.Context) error {
	if err := d.patch(ctx, `{"spec":{"state":"Paused"}}`); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "Ready=True and Paused=True", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionPaused)
	}); err != nil {
		return err
	}
	delivered, flows := d.w.delivered(), len(d.w.flows())
	return d.watch(ctx, 3*time.Second, func() error {
		if got := d.w.delivered(); got != delivered {
			return fmt.Errorf("%d messages reached the application while paused", got-delivered)
		}
		if got := len(d.w.flows()); got != flows {
			return fmt.Errorf("the pods sent the broker %d FLOW commands while paused", got-flows)
		}
		backlog, err := d.w.backlog(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("   held: 0 messages handed over, 0 new FLOW permits on the wire, backlog %d messages and growing\n", backlog)
		return nil
	})
}

func (d *demo) seek(ctx context.Context) error {
	// Back to half of what was produced, or to the first message no application has received
	// if that is earlier: a seek forward past it would skip it, and the demo ends by checking
	// that every message was delivered.
	index := min(d.w.produced.Load()/2, int64(d.w.firstMissing()))
	fmt.Printf("   kubectl patch sf %s --type merge -p '{\"spec\":{\"seek\":{\"id\":\"replay-1\",\"index\":%d}}}'\n", flowName, index)
	if err := d.patch(ctx, fmt.Sprintf(`{"spec":{"seek":{"id":"replay-1","index":%d}}}`, index)); err != nil {
		return err
	}
	var seek *subflowv1.SeekStatus
	if err := d.waitFor(ctx, "SeekCompleted=True", func(f *subflowv1.SubscriptionFlow) bool {
		seek = f.Status.Seek
		return meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionSeekCompleted)
	}); err != nil {
		return err
	}
	for _, p := range seek.Positions {
		fmt.Printf("   executor %s moved the cursor: index %d -> message id %s\n", seek.Executor, p.Index, p.MessageID)
	}
	delivered := d.w.delivered()
	// The reconnect after the seek re-grants the receiver queue (a known client limit);
	// the gate holds those messages.
	return d.watch(ctx, 2*time.Second, func() error {
		if got := d.w.delivered(); got != delivered {
			return fmt.Errorf("%d messages reached the application after the seek while paused", got-delivered)
		}
		return nil
	})
}

// window declares a weekly window and moves the controller's clock into it: the spec says
// Running, the window holds the flow Paused.
func (d *demo) window(ctx context.Context) error {
	d.w.clock.Set(nextSaturday(3, 10))
	fmt.Printf("   demo clock -> %s\n", d.w.clock.Now().UTC().Format(time.RFC1123))
	err := d.patch(ctx, `{"spec":{"state":"Running","maintenanceWindows":[{"schedule":"0 3 * * 6","duration":"1h","timeZone":"UTC","state":"Paused"}]}}`)
	if err != nil {
		return err
	}
	var f *subflowv1.SubscriptionFlow
	if err := d.waitFor(ctx, "Paused by the window", func(got *subflowv1.SubscriptionFlow) bool {
		f = got
		return ready(got) && got.Status.StateSource == subflowv1.SourceWindow && meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionPaused)
	}); err != nil {
		return err
	}
	fmt.Printf("   spec.state Running, effective %s from %s until %s\n", f.Status.EffectiveState, f.Status.StateSource,
		f.Status.NextTransitionTime.UTC().Format(time.Kitchen))
	return nil
}

// resume ends the window (clock past 04:00) and waits until every message produced so far
// reached an application; the producer keeps going (for --interactive).
func (d *demo) resume(ctx context.Context) error {
	d.w.clock.Set(nextSaturday(4, 5))
	fmt.Printf("   demo clock -> %s: the window is over\n", d.w.clock.Now().UTC().Format(time.RFC1123))
	if err := d.reconcileNow(ctx); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "Running again", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && f.Status.EffectiveState == subflowv1.StateRunning && f.Status.Consumers.Running == int32(len(d.w.pods))
	}); err != nil {
		return err
	}
	return d.drained(ctx)
}

// drained waits until every message produced so far reached an application; the producer
// keeps going (for --interactive).
func (d *demo) drained(ctx context.Context) error {
	produced := int(d.w.produced.Load())
	deadline := time.Now().Add(60 * time.Second)
	for d.w.missing(produced) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of the first %d produced messages were never delivered", d.w.missing(produced), produced)
		}
		d.table(ctx)
		time.Sleep(500 * time.Millisecond)
	}
	d.table(ctx)
	fmt.Printf("   all %d messages produced before the check delivered (%d deliveries so far, seek replays included)\n",
		produced, d.w.delivered())
	return nil
}

func nextSaturday(hour, minute int) time.Time {
	now := time.Now().UTC()
	days := (int(time.Saturday) - int(now.Weekday()) + 7) % 7
	if days == 0 {
		days = 7
	}
	day := now.AddDate(0, 0, days)
	return time.Date(day.Year(), day.Month(), day.Day(), hour, minute, 0, 0, time.UTC)
}

func ready(f *subflowv1.SubscriptionFlow) bool {
	return f.Status.ObservedGeneration == f.Generation && meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionReady)
}

// reconcileNow has the controller reconcile the flow now, after the demo moved its clock,
// instead of at its real-time requeue.
func (d *demo) reconcileNow(ctx context.Context) error {
	return d.patch(ctx, fmt.Sprintf(`{"metadata":{"annotations":{"demo.subflow.dev/clock":"%d"}}}`, time.Now().UnixNano()))
}

func (d *demo) patch(ctx context.Context, patch string) error {
	flow := &subflowv1.SubscriptionFlow{}
	flow.Namespace, flow.Name = namespace, flowName
	return d.w.k8s.Patch(ctx, flow, client.RawPatch("application/merge-patch+json", []byte(patch)))
}

func (d *demo) get(ctx context.Context) (*subflowv1.SubscriptionFlow, error) {
	f := &subflowv1.SubscriptionFlow{}
	return f, d.w.k8s.Get(ctx, d.flowKey(), f)
}

// waitFor polls the flow until cond holds, printing the table meanwhile.
func (d *demo) waitFor(ctx context.Context, what string, cond func(*subflowv1.SubscriptionFlow) bool) error {
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for {
		f, err := d.get(ctx)
		if err != nil {
			return err
		}
		if cond(f) {
			fmt.Printf("   %s after %s\n", what, time.Since(start).Round(time.Millisecond))
			d.table(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s; status: %+v", what, f.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watch prints the table for a while, checking hold at every tick.
func (d *demo) watch(ctx context.Context, span time.Duration, hold func() error) error {
	end := time.Now().Add(span)
	for time.Now().Before(end) {
		time.Sleep(time.Second)
		d.table(ctx)
		if err := hold(); err != nil {
			return err
		}
	}
	return nil
}

// table prints one line per pod and the flow's conditions.
func (d *demo) table(ctx context.Context) {
	now := time.Now()
	if d.lastCount == nil {
		d.lastCount = map[string]int{}
		d.lastTime = now
	}
	elapsed := now.Sub(d.lastTime).Seconds()
	permits := map[string]uint64{}
	for _, f := range d.w.flows() {
		permits[f.Consumer.Name] += uint64(f.Permits)
	}
	fmt.Printf("   %-17s %-8s %7s %6s %9s %11s\n", "POD", "STATE", "MSG/S", "HELD", "RECEIVED", "FLOW-PERMITS")
	for _, p := range d.w.pods {
		st := p.Consumer.Status()
		got := p.Received()
		rate := 0.0
		if elapsed > 0 {
			rate = float64(got-d.lastCount[p.Name]) / elapsed
		}
		d.lastCount[p.Name] = got
		fmt.Printf("   %-17s %-8s %7.0f %6d %9d %11d\n", p.Name, st.State, rate, st.HeldMessages, got, permits[p.Name])
	}
	d.lastTime = now
	if f, err := d.get(ctx); err == nil {
		fmt.Printf("   flow: effective %s (%s) paused %s revision %d | %s | produced %d\n", f.Status.EffectiveState,
			f.Status.StateSource, f.Status.Consumers.Halted, f.Status.Revision, conditions(f), d.w.produced.Load())
	}
}

func conditions(f *subflowv1.SubscriptionFlow) string {
	var parts []string
	for _, c := range f.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return strings.Join(parts, " ")
}

// delivered counts messages handed to the applications (replays included).
func (w *world) delivered() int {
	n := 0
	for _, p := range w.pods {
		n += p.Received()
	}
	return n
}

// firstMissing is the lowest i such that no application received order-i, which is also its
// broker-entry index (one producer, one topic).
func (w *world) firstMissing() int {
	seen := w.seen()
	i := 0
	for seen[fmt.Sprintf("order-%d", i)] {
		i++
	}
	return i
}

func (w *world) seen() map[string]bool {
	seen := map[string]bool{}
	for _, p := range w.pods {
		for _, payload := range p.Payloads() {
			seen[payload] = true
		}
	}
	return seen
}

// missing counts the first n produced messages (order-0 .. order-n-1) no application received.
func (w *world) missing(n int) int {
	seen := w.seen()
	count := 0
	for i := range n {
		if !seen[fmt.Sprintf("order-%d", i)] {
			count++
		}
	}
	return count
}
