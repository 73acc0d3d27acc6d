package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
)

// pod is one consumer pod of the demo: an agent whose control server listens on its own
// loopback port, and an application that receives and acknowledges. It is built here rather
// than with internal/podsim because each pod needs its own metrics registry, served on the
// control server's /metrics as a real pod's agent serves it (podsim registers no agent metrics).
type pod struct {
	Name     string
	Port     int
	Consumer *agent.Consumer

	agent  *agent.Agent
	client pulsar.Client
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu       sync.Mutex
	payloads []string
}

func startPod(name, serviceURL, adminURL string) (*pod, error) {
	registry := prometheus.NewRegistry()
	a, err := agent.New(agent.Options{Name: name, AdminURL: adminURL, Registerer: registry})
	if err != nil {
		return nil, err
	}
	// /metrics answers without the token (the control server's default), like a scraper expects.
	srv, err := control.New(a, control.Options{Token: token, Gatherer: registry})
	if err != nil {
		a.Close()
		return nil, err
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pod{Name: name, Port: listener.Addr().(*net.TCPAddr).Port, agent: a, cancel: cancel}
	p.done.Add(1)
	go func() { defer p.done.Done(); _ = srv.Serve(ctx, listener) }()
	p.client, err = pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: log.DefaultNopLogger()})
	if err == nil {
		p.Consumer, err = a.Subscribe(p.client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: subscription,
			Type: pulsar.Shared, Name: name, ReceiverQueueSize: 50})
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	p.done.Add(1)
	go p.consume(ctx)
	return p, nil
}

// consume is the application: receive, record, acknowledge.
func (p *pod) consume(ctx context.Context) {
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
		_ = p.Consumer.Ack(msg)
	}
}

// Received is how many messages reached the application.
func (p *pod) Received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.payloads)
}

// Payloads returns a copy of what reached the application, in order.
func (p *pod) Payloads() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.payloads...)
}

// Close stops consuming and serving; unacknowledged messages go back to the broker.
func (p *pod) Close() {
	p.cancel()
	if p.Consumer != nil {
		p.Consumer.Close()
	}
	p.done.Wait()
	if p.client != nil {
		p.client.Close()
	}
	p.agent.Close()
}
