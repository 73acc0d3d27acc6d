// Package podsim runs a simulated consumer pod in-process: an agent with its control server on
// loopback and a gated consumer that receives and acknowledges messages, counting what reaches
// the application. Tests and the demo stand one up per Pod object.
package podsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
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
}

// Pod is a running simulated pod.
type Pod struct {
	Name     string
	Addr     string // host:port of the control server
	Port     int
	Agent    *agent.Agent
	Consumer *agent.Consumer

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
	agentOpts := agent.Options{Name: opts.Name, AdminURL: opts.AdminURL, StartGated: opts.StartGated}
	controlOpts := control.Options{Token: opts.Token, TokenFile: opts.TokenFile, TLSCertFile: opts.TLSCertFile, TLSKeyFile: opts.TLSKeyFile}
	if opts.Metrics != nil {
		agentOpts.Registerer, controlOpts.Gatherer = opts.Metrics, opts.Metrics
	}
	a, err := agent.New(agentOpts)
	if err != nil {
		return nil, err
	}
	srv, err := control.New(a, controlOpts)
	if err != nil {
		return nil, err
	}
	listener, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pod{Name: opts.Name, Addr: listener.Addr().String(), Port: listener.Addr().(*net.TCPAddr).Port, Agent: a, cancel: cancel,
		processing: opts.ProcessingTime}
	p.done.Add(1)
	go func() { defer p.done.Done(); _ = srv.Serve(ctx, listener) }()

	p.client, p.ownsClient = opts.Client, opts.Client == nil
	if p.ownsClient {
		p.client, err = pulsar.NewClient(pulsar.ClientOptions{URL: opts.ServiceURL, Logger: log.DefaultNopLogger()})
	}
	if err == nil {
		p.Consumer, err = a.Subscribe(p.client, pulsar.ConsumerOptions{Topic: opts.Topic, SubscriptionName: opts.Subscription,
			Type: opts.Type, Name: opts.Name, ReceiverQueueSize: opts.ReceiverQueueSize})
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("pod %s: %w", opts.Name, err)
	}
	p.done.Add(1)
	go p.consume(ctx)
	return p, nil
}

// consume is the application: receive, record, acknowledge.
func (p *Pod) consume(ctx context.Context) {
	defer p.done.Done()
	for {
		msg, err := p.Consumer.Receive(ctx)
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
		_ = p.Consumer.Ack(msg)
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
	p.cancel()
	if p.Consumer != nil {
		p.Consumer.Close()
	}
	p.done.Wait()
	if p.client != nil && p.ownsClient {
		p.client.Close()
	}
	p.Agent.Close()
}
