package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
)

// A sidecar pod runs an unmodified pulsar-client-go application whose service URL is an
// in-process protocol sidecar (strict mode); the sidecar reaches the brokers through the wire
// recorder and its control server is the pod's control endpoint, as an agent's is.

// sidecarShare is the share of pods drawn as sidecar pods: one in sidecarShare.
const sidecarShare = 4

// Leak bounds of a sidecar pod (docs/sidecar.md, Semantics). pulsar-client-go v0.21 clears
// its receiver queue when the strict pause makes it subscribe again, but not the consumer's
// message channel (clientMessageChannel) nor the message its dispatcher holds: those still
// reach the application after Paused. Stopped does not take back what the client buffered
// at all: its receiver queue comes on top.
const (
	clientMessageChannel = 10
	transitionBound      = 5 * time.Second // a transition records its state this long after handing over at most
)

// sidecarEligible tells whether a group's pods may be sidecar pods. The nacking group reads
// its retry-letter topic on the same subscription: the sidecar sees that as a consumer of
// another topic, which the flow's spec.topic does not match, so the flow would not gate it.
func sidecarEligible(g *group) bool { return g.app == nil }

// sidecarLeakBound is how many messages may reach the application of a sidecar consumer of g
// while its consumer reports state continuously, per partition or topic and interval.
func sidecarLeakBound(g *group, state protocol.State) int {
	bound := clientMessageChannel + 1
	if state == protocol.Stopped {
		bound += int(g.grant())
	}
	return bound
}

// sidecarApp is the application of a sidecar pod: a plain pulsar-client-go consumer.
type sidecarApp struct {
	c     pulsar.Consumer
	name  string
	group *group
	pod   string
	sc    *sidecar.Sidecar
	halt  func() // ends run and waits for it

	mu     sync.Mutex
	leaked map[spanKey]int // messages handed over while gated, per gated span
}

// spanKey is one sidecar consumer (topic or partition) in one reported state.
type spanKey struct {
	topic string
	since time.Time
}

// startSidecarProcess starts a sidecar pod's process: sidecar with its admin access, control server,
// then the application's client through the sidecar.
func startSidecarProcess(env processEnv, p *simPod, proc *agentProcess) error {
	// Start-gated as the agent pods are, so a restarted pod meets the rules before any permit.
	sc, err := sidecar.New(sidecar.Options{BrokerURL: env.serviceURL, ListenAddr: "127.0.0.1:0", StrictPause: true,
		StartGated: true, SyncTimeout: 3 * time.Second, Name: p.name, Logger: env.sidecarLogger(p.name)})
	if err != nil {
		return err
	}
	proc.sidecar = sc
	srv, err := control.NewForHost(sc.ControlHost(proc.sideAdmin), control.Options{Token: env.token, SeekTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	data, err := proc.serve(sc.Serve)
	if err != nil {
		return err
	}
	ctl, err := proc.serve(srv.Serve)
	if err != nil {
		return err
	}
	p.proxy.target.Store(ctl)
	proc.client, err = pulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://" + data, Logger: env.clientLog.Logger(),
		OperationTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	return proc.subscribeApp(env, p)
}

// sidecarLogger is where a sidecar logs: the operation trace, so that a violation can be read
// next to what the sidecar saw (a connection closed, a refused re-subscribe), or nowhere.
func (env processEnv) sidecarLogger(pod string) logr.Logger {
	if env.verbose == nil {
		return logr.Discard()
	}
	h := slog.NewTextHandler(env.verbose, &slog.HandlerOptions{Level: slog.LevelInfo})
	return logr.FromSlogHandler(h).WithValues("sidecarPod", pod)
}

// serve runs serve on a loopback listener until the process stops and returns its address.
func (proc *agentProcess) serve(serve func(context.Context, net.Listener) error) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	proc.addCancel(func(ctx context.Context) { _ = serve(ctx, ln) })
	return ln.Addr().String(), nil
}

// addCancel runs fn until the process stops.
func (proc *agentProcess) addCancel(fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	prev := proc.cancel
	proc.cancel = func() {
		cancel()
		if prev != nil {
			prev()
		}
	}
	proc.done.Add(1)
	go func() { defer proc.done.Done(); fn(ctx) }()
}

func (proc *agentProcess) subscribeApp(env processEnv, p *simPod) error {
	opts := p.group.consumer
	opts.SubscriptionName = p.group.subscription
	opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	opts.Name = fmt.Sprintf("%s-i%d", p.name, proc.id)
	c, err := proc.client.Subscribe(opts)
	if err != nil {
		return err
	}
	app := &sidecarApp{c: c, name: opts.Name, group: p.group, pod: p.name, sc: proc.sidecar,
		leaked: map[spanKey]int{}}
	proc.apps = append(proc.apps, app)
	useChan := p.group.useChan && p.serial%2 == 1
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); app.run(ctx, env, useChan) }()
	app.halt = func() { cancel(); <-done }
	return nil
}

// close ends the application: its receive first, as pulsar-client-go v0.21's zero-queue
// consumer holds its lock in Receive, which Close takes (Close would wait forever).
func (a *sidecarApp) close() {
	a.halt()
	a.c.Close()
}

// states are the sidecar's consumers of this application now, by topic (partition).
func (a *sidecarApp) states() map[string]protocol.ConsumerStatus {
	out := map[string]protocol.ConsumerStatus{}
	for _, c := range a.sc.Consumers() {
		if c.Name() == a.name {
			out[c.Topic()] = c.Status()
		}
	}
	return out
}

// run receives, checks the strict-pause bound, records and acknowledges.
func (a *sidecarApp) run(ctx context.Context, env processEnv, useChan bool) {
	for {
		before := a.states()
		msg, err := a.receive(ctx, useChan)
		if err != nil {
			if ctx.Err() != nil || consumerClosed(err) {
				return
			}
			continue
		}
		if st, ok := before[msg.Topic()]; ok && st.State != protocol.Running {
			a.checkPause(ctx, env, msg, st)
		}
		env.ledger.deliver(a.group.subscription, msg)
		env.sidecarDeliveries.Add(1)
		_ = a.c.Ack(msg)
	}
}

func (a *sidecarApp) receive(ctx context.Context, useChan bool) (pulsar.Message, error) {
	if !useChan {
		return a.c.Receive(ctx)
	}
	select {
	case cm, ok := <-a.c.Chan():
		if !ok {
			return nil, errChanClosed
		}
		return cm.Message, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var errChanClosed = errors.New("the consumer's channel is closed")

func consumerClosed(err error) bool {
	var pe *pulsar.Error
	return errors.Is(err, errChanClosed) || (errors.As(err, &pe) && pe.Result() == pulsar.ConsumerClosed)
}

// checkPause counts a message handed over although the sidecar consumer of its partition
// reported before (Paused or Stopped) when Receive was called, unless that state ends within
// transitionBound (a resume records Running after it handed over what it held), and reports
// the span once it exceeds the leak bound.
func (a *sidecarApp) checkPause(ctx context.Context, env processEnv, msg pulsar.Message, before protocol.ConsumerStatus) {
	env.gatedReceives.Add(1)
	env.sidecarGated.Add(1)
	if a.stateEnds(ctx, msg.Topic(), before) {
		return
	}
	env.sidecarLeaked.Add(1)
	key := spanKey{msg.Topic(), before.Since}
	a.mu.Lock()
	a.leaked[key]++
	n := a.leaked[key]
	a.mu.Unlock()
	if bound := sidecarLeakBound(a.group, before.State); n == bound+1 {
		env.onViolation("strict-pause", fmt.Sprintf("sidecar consumer %s (pod %s) on %s handed over %d messages while %s since %s, more than the bound %d (last %q id %v)",
			a.name, a.pod, msg.Topic(), n, before.State, before.Since.Format(time.RFC3339Nano), bound, msg.Payload(), msg.ID()))
	}
}

// stateEnds polls, with a deadline, whether the partition's consumer leaves the state before.
func (a *sidecarApp) stateEnds(ctx context.Context, topic string, before protocol.ConsumerStatus) bool {
	deadline := time.Now().Add(transitionBound)
	for {
		now, ok := a.states()[topic]
		if !ok || now.State != before.State || !now.Since.Equal(before.Since) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		_ = sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) // polling pace of a deadline-bounded wait
	}
}
