package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// group is one kind of consumer application: its pods share a subscription and a flow.
type group struct {
	name         string // flow name and the pods' app label
	subscription string
	flowTopic    string // spec.topic of the flow; empty for the regex group
	topics       []string
	consumer     pulsar.ConsumerOptions // Topic or TopicsPattern, Type, queue size
	partitions   int                    // of flowTopic; 0 when not partitioned
	useChan      bool                   // every other pod reads Chan() instead of Receive
	chunked      bool                   // its topic carries chunked messages
	app          appPolicy              // what the application does with a message; nil: acknowledge
}

// appPolicy handles one delivered message: acknowledge it, nack it or reconsume it later.
type appPolicy func(c *agent.Consumer, msg pulsar.Message)

// nackingApp nacks the first delivery of every eleventh message, reconsumes every thirteenth
// later through the retry-letter topic, always nacks every twenty-ninth (which the client then
// dead-letters after three deliveries) and acknowledges the rest.
func nackingApp(c *agent.Consumer, msg pulsar.Message) {
	_, n, _ := parsePayload(msg.Payload())
	first := msg.RedeliveryCount() == 0 && msg.Properties()["RECONSUMETIMES"] == ""
	switch {
	case n%29 == 0:
		c.Nack(msg)
	case n%11 == 0 && first:
		c.Nack(msg)
	case n%13 == 0 && first:
		c.ReconsumeLater(msg, 500*time.Millisecond)
	default:
		_ = c.Ack(msg)
	}
}

// grant is the FLOW permits a (re)subscribe asks for: the receiver queue, or one for zero-queue.
func (g *group) grant() uint32 {
	if g.consumer.EnableZeroQueueConsumer {
		return 1
	}
	return uint32(g.consumer.ReceiverQueueSize)
}

// simPod is a simulated pod: a stable agent address (the Pod object's port) in front of the
// current agent process, which restarts with fresh state.
type simPod struct {
	name    string
	group   *group
	serial  int
	sidecar bool // a sidecar pod: the application's client goes through a protocol sidecar
	proxy   *agentProxy

	mu       sync.Mutex
	proc     *agentProcess
	restarts int32
}

// agentProcess is one life of a pod's application: agent, control server, consumers, apps.
// In a sidecar pod it is the sidecar with its admin access and the application behind it.
type agentProcess struct {
	id        int
	group     *group
	agent     *agent.Agent   // nil in a sidecar pod
	sideAdmin *sidecar.Admin // a sidecar pod's admin calls; nil in an agent pod
	client    pulsar.Client
	admin     *adminProxy
	consumers []*trackedConsumer
	sidecar   *sidecar.Sidecar // nil in an agent pod
	apps      []*sidecarApp
	cancel    context.CancelFunc
	done      sync.WaitGroup
}

// trackedConsumer is a gated consumer with the application reading it.
type trackedConsumer struct {
	c        *agent.Consumer
	gate     gateView // c as the control server sees it
	name     string
	group    *group
	instance int
	pod      string
}

// processEnv is what an agent process needs from the world.
type processEnv struct {
	serviceURL, token string
	adminURLs         []string // every broker's, the leader's first
	faults            *adminFaults
	ledger            *ledger
	onReset           func(resetRecord)
	onViolation       func(kind, detail string)
	gatedReceives     *atomic.Int64 // messages a Receive called while gated returned
	sidecarDeliveries *atomic.Int64 // messages the applications of sidecar pods received
	sidecarGated      *atomic.Int64 // of gatedReceives, those of sidecar pods
	sidecarLeaked     *atomic.Int64 // of those, handed over while the state held (within the bound)
	adminRedirects    *atomic.Int64 // 307s to the owner's admin URL, rewritten to the proxy
	clientLog         *testkit.ClientLog
	nextInstance      func() int
	verbose           io.Writer // where the operation trace goes (Config.Verbose), if anywhere; sidecars log there too
}

func startProcess(env processEnv, p *simPod) (*agentProcess, error) {
	id := env.nextInstance()
	admin, err := newAdminProxy(env.adminURLs, id, env.faults, env.onReset, env.adminRedirects)
	if err != nil {
		return nil, err
	}
	if p.sidecar {
		return startSidecar(env, p, id, admin)
	}
	a, err := agent.New(agent.Options{Name: p.name, AdminURL: admin.url(), StartGated: true, SyncTimeout: 3 * time.Second})
	if err != nil {
		admin.close()
		return nil, err
	}
	proc := &agentProcess{id: id, group: p.group, agent: a, admin: admin}
	srv, err := control.New(a, control.Options{Token: env.token, SeekTimeout: 30 * time.Second})
	if err == nil {
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			ctx, cancel := context.WithCancel(context.Background())
			proc.cancel = cancel
			proc.done.Add(1)
			go func() { defer proc.done.Done(); _ = srv.Serve(ctx, ln) }()
			p.proxy.target.Store(ln.Addr().String())
		}
	}
	if err == nil {
		proc.client, err = pulsar.NewClient(pulsar.ClientOptions{URL: env.serviceURL, Logger: env.clientLog.Logger(),
			OperationTimeout: 10 * time.Second})
	}
	if err == nil {
		err = proc.subscribe(env, p)
	}
	if err != nil {
		proc.stop()
		return nil, fmt.Errorf("pod %s: %w", p.name, err)
	}
	return proc, nil
}

func startSidecar(env processEnv, p *simPod, id int, admin *adminProxy) (*agentProcess, error) {
	proc := &agentProcess{id: id, group: p.group, sideAdmin: sidecar.NewAdmin(sidecar.AdminOptions{URL: admin.url()}), admin: admin}
	if err := startSidecarProcess(env, p, proc); err != nil {
		proc.stop()
		return nil, fmt.Errorf("sidecar pod %s: %w", p.name, err)
	}
	return proc, nil
}

func (proc *agentProcess) subscribe(env processEnv, p *simPod) error {
	opts := p.group.consumer
	opts.SubscriptionName = p.group.subscription
	// The producer starts before the first pod: its first messages must be on the subscription.
	opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	opts.Name = fmt.Sprintf("%s-i%d", p.name, proc.id) // a new name per process: the FLOW record tells lives apart
	c, err := proc.agent.Subscribe(proc.client, opts)
	if err != nil {
		return err
	}
	tc := &trackedConsumer{c: c, name: opts.Name, group: p.group, instance: proc.id, pod: p.name}
	for _, cc := range control.AgentHost(proc.agent).Consumers() {
		if cc.Name() == opts.Name {
			tc.gate = controlledGate{cc}
		}
	}
	proc.consumers = append(proc.consumers, tc)
	ctx, cancel := context.WithCancel(context.Background())
	prev := proc.cancel
	proc.cancel = func() { cancel(); prev() }
	proc.done.Add(1)
	useChan := p.group.useChan && p.serial%2 == 1
	go func() { defer proc.done.Done(); tc.application(ctx, env, useChan) }()
	return nil
}

// application receives, checks the strict-pause invariant, records and acknowledges.
func (tc *trackedConsumer) application(ctx context.Context, env processEnv, useChan bool) {
	var ch <-chan pulsar.ConsumerMessage
	if useChan {
		ch = tc.c.Chan()
	}
	for {
		before := tc.c.Status()
		var msg pulsar.Message
		if useChan {
			select {
			case cm := <-ch:
				msg = cm.Message
			case <-ctx.Done():
				return
			}
		} else {
			m, err := tc.c.Receive(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, agent.ErrConsumerClosed) {
					return
				}
				continue
			}
			msg = m
		}
		if msg == nil {
			continue
		}
		if before.State != protocol.Running {
			tc.checkStrictPause(env, before, msg)
		}
		env.ledger.deliver(tc.group.subscription, msg)
		if tc.group.app != nil {
			tc.group.app(tc.c, msg)
		} else {
			_ = tc.c.Ack(msg)
		}
	}
}

// checkStrictPause is called for a message Receive returned although the consumer was
// Paused or Stopped (since before.Since) when Receive was called.
func (tc *trackedConsumer) checkStrictPause(env processEnv, before protocol.ConsumerStatus, msg pulsar.Message) {
	env.gatedReceives.Add(1)
	if handedWhileGated(tc.gate, before) {
		env.onViolation("strict-pause", fmt.Sprintf("consumer %s (pod %s) handed over %q (id %v) while %s since %s",
			tc.name, tc.pod, msg.Payload(), msg.ID(), before.State, before.Since.Format(time.RFC3339Nano)))
	}
}

// gateView is what the strict-pause check reads of a consumer.
type gateView interface {
	settle() // returns once a transition in progress ended
	Status() protocol.ConsumerStatus
}

// controlledGate is a tracked consumer as the control server drives it (control.Consumer).
type controlledGate struct{ control.Consumer }

// settle waits for the consumer's transition lock: a request of a generation below any applied
// one takes it and is refused, changing nothing.
func (g controlledGate) settle() { _ = g.SetState(context.Background(), protocol.Running, -1) }

// handedWhileGated reports whether a message that Receive returned was handed over while the
// gate stayed closed: once any transition in progress has finished (a transition records its
// state before it releases the lock), the state must differ from the one before Receive, or
// at least have changed since. A transition opens the gate before it records Running, which is
// why the check waits for it instead of comparing at once.
func handedWhileGated(c gateView, before protocol.ConsumerStatus) bool {
	c.settle()
	after := c.Status()
	return after.State == before.State && after.Since.Equal(before.Since)
}

// stop ends the process as an exit would: consumers closed (unacked messages return to the
// broker), server and admin proxy gone, nothing remembered.
func (proc *agentProcess) stop() {
	for _, tc := range proc.consumers {
		tc.c.Close()
	}
	for _, app := range proc.apps {
		app.close()
	}
	if proc.cancel != nil {
		proc.cancel()
	}
	proc.done.Wait()
	if proc.client != nil {
		proc.client.Close()
	}
	if proc.agent != nil {
		proc.agent.Close()
	}
	if proc.sideAdmin != nil {
		proc.sideAdmin.Close()
	}
	proc.admin.close()
}
