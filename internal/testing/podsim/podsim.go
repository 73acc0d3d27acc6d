// Package podsim runs a simulated consumer pod in-process: an agent with its control server on
// loopback and a gated consumer that receives and acknowledges messages, counting what reaches
// the application; or, with Options.Sidecar, a plain pulsar-client-go application whose client
// goes through a protocol sidecar serving the same control API. Tests, benchmarks and the demo
// stand one up per Pod object.
package podsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
)

// Options describe one simulated pod.
type Options struct {
	Name                 string
	ServiceURL, AdminURL string
	Token                string
	// TokenFile, when set, is the agent's token file instead of Token: tests rewrite it as the
	// kubelet rewrites a mounted Secret.
	TokenFile           string
	Topic, Subscription string
	Type                pulsar.SubscriptionType
	ReceiverQueueSize   int
	StartGated          bool
	// Addr is the control server's address; empty means a random loopback port.
	Addr string
	// Client is a shared Pulsar client; nil means the pod creates (and closes) its own.
	Client pulsar.Client
	// TLSCertFile and TLSKeyFile make the control server serve https.
	TLSCertFile, TLSKeyFile string
	// ProcessingTime is how long the application works on each message (a slow downstream);
	// zero means it acknowledges at once.
	ProcessingTime time.Duration
	// Metrics, when set, receives the agent's metrics and is served on the control server's
	// /metrics, as a real pod's agent serves its own; nil registers none.
	Metrics *prometheus.Registry
	// Sidecar makes it a sidecar pod: the application's own client (Client is ignored)
	// reaches ServiceURL through an in-process agent/sidecar, whose control server is the
	// pod's; StrictPause is the sidecar's strict mode.
	Sidecar, StrictPause bool
	// BacklogRefresh is how often the agent reads a watched backlog again (zero: the agent's
	// default).
	BacklogRefresh time.Duration
}

// receiver is what the application consumes from: the agent's consumer, or the client's own
// behind a sidecar.
type receiver interface {
	Receive(ctx context.Context) (pulsar.Message, error)
	Ack(msg pulsar.Message) error
}

// Pod is a running simulated pod.
type Pod struct {
	Name     string
	Addr     string // host:port of the control server
	Port     int
	Agent    *agent.Agent     // a sidecar pod's has no consumer
	Consumer *agent.Consumer  // nil in a sidecar pod
	Sidecar  *sidecar.Sidecar // nil in an agent pod

	sidecarAdmin *sidecar.Admin // the sidecar's admin calls; nil in an agent pod

	app        receiver
	appClose   func()
	client     pulsar.Client
	ownsClient bool
	processing time.Duration
	cancel     context.CancelFunc
	done       sync.WaitGroup

	mu       sync.Mutex
	payloads []string
}

// Start starts the control server, subscribes and begins consuming.
func Start(opts Options) (*Pod, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	agentOpts := agent.Options{Name: opts.Name, AdminURL: opts.AdminURL, StartGated: opts.StartGated && !opts.Sidecar,
		BacklogRefresh: opts.BacklogRefresh}
	controlOpts := control.Options{Token: opts.Token, TokenFile: opts.TokenFile, TLSCertFile: opts.TLSCertFile, TLSKeyFile: opts.TLSKeyFile}
	if opts.Metrics != nil {
		agentOpts.Registerer, controlOpts.Gatherer = opts.Metrics, opts.Metrics
	}
	a, err := agent.New(agentOpts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pod{Name: opts.Name, Agent: a, cancel: cancel, processing: opts.ProcessingTime}
	if err := p.start(ctx, opts, controlOpts); err != nil {
		p.Close()
		return nil, fmt.Errorf("pod %s: %w", opts.Name, err)
	}
	p.done.Add(1)
	go p.consume(ctx)
	return p, nil
}

// start serves the control API and subscribes the application, through the agent or the sidecar.
func (p *Pod) start(ctx context.Context, opts Options, controlOpts control.Options) error {
	host := control.Host(control.AgentHost(p.Agent))
	if opts.Sidecar {
		sc, err := sidecar.New(sidecar.Options{BrokerURL: opts.ServiceURL, ListenAddr: "127.0.0.1:0", Name: opts.Name,
			StrictPause: opts.StrictPause, StartGated: opts.StartGated})
		if err != nil {
			return err
		}
		data, err := p.serve(ctx, "127.0.0.1:0", sc.Serve)
		if err != nil {
			return err
		}
		p.sidecarAdmin = sidecar.NewAdmin(sidecar.AdminOptions{URL: opts.AdminURL, BacklogRefresh: opts.BacklogRefresh})
		p.Sidecar, host = sc, sc.ControlHost(p.sidecarAdmin)
		opts.ServiceURL, opts.Client = "pulsar://"+data, nil
	}
	srv, err := control.NewForHost(host, controlOpts)
	if err != nil {
		return err
	}
	if p.Addr, err = p.serve(ctx, opts.Addr, srv.Serve); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(p.Addr)
	p.Port, _ = strconv.Atoi(port)
	p.client, p.ownsClient = opts.Client, opts.Client == nil
	if p.ownsClient {
		if p.client, err = pulsar.NewClient(pulsar.ClientOptions{URL: opts.ServiceURL, Logger: log.DefaultNopLogger()}); err != nil {
			return err
		}
	}
	consumerOpts := pulsar.ConsumerOptions{Topic: opts.Topic, SubscriptionName: opts.Subscription,
		Type: opts.Type, Name: opts.Name, ReceiverQueueSize: opts.ReceiverQueueSize}
	if opts.Sidecar {
		c, err := p.client.Subscribe(consumerOpts)
		if err != nil {
			return err
		}
		p.app, p.appClose = c, c.Close
		return nil
	}
	if p.Consumer, err = p.Agent.Subscribe(p.client, consumerOpts); err != nil {
		return err
	}
	p.app, p.appClose = p.Consumer, p.Consumer.Close
	return nil
}

// serve runs serve on a listener at addr until the pod closes and returns its address.
func (p *Pod) serve(ctx context.Context, addr string, serve func(context.Context, net.Listener) error) (string, error) {
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	p.done.Add(1)
	go func() { defer p.done.Done(); _ = serve(ctx, listener) }()
	return listener.Addr().String(), nil
}

// Status is what the pod's agent or sidecar reports of the application's consumer (the first
// one the sidecar saw subscribe, for a sidecar pod; zero before it has).
func (p *Pod) Status() protocol.ConsumerStatus {
	if p.Consumer != nil {
		return p.Consumer.Status()
	}
	if consumers := p.Sidecar.Consumers(); len(consumers) > 0 {
		return consumers[0].Status()
	}
	return protocol.ConsumerStatus{}
}

// consume is the application: receive, record, acknowledge.
func (p *Pod) consume(ctx context.Context) {
	defer p.done.Done()
	for {
		msg, err := p.app.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, agent.ErrConsumerClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		p.payloads = append(p.payloads, string(msg.Payload()))
		p.mu.Unlock()
		if p.processing > 0 {
			select {
			case <-time.After(p.processing):
			case <-ctx.Done():
			}
		}
		_ = p.app.Ack(msg)
	}
}

// Received is how many messages reached the application.
func (p *Pod) Received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.payloads)
}

// Payloads returns a copy of what reached the application, in order.
func (p *Pod) Payloads() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.payloads...)
}

// Close stops consuming and serving, closes the consumer (unacked messages go back to the
// broker) and the client. Like a process exit, it forgets everything the agent knew.
func (p *Pod) Close() {
	if p.appClose != nil {
		p.appClose() // first: a sidecar pod's client closes its consumer through the sidecar
	}
	p.cancel()
	p.done.Wait()
	if p.client != nil && p.ownsClient {
		p.client.Close()
	}
	p.Agent.Close()
	if p.sidecarAdmin != nil {
		p.sidecarAdmin.Close()
	}
}
