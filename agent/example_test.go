package agent_test

import (
	"context"
	"fmt"
	"net"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// An application creates the agent and its control server, subscribes through the agent
// instead of the client, and consumes as usual: the controller (through the control server)
// or the application itself pauses, resumes and seeks the consumer. An in-process test broker
// stands in for the Pulsar cluster; examples/consumer is the same flow as a pod runs it.
func Example() {
	broker, err := pulsartest.New(pulsartest.Options{})
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The agent; the admin URL is for seeks by index (and the backlog reports the controller
	// asks for), with the application's own credentials (Options.AdminAuth).
	a, err := agent.New(agent.Options{Name: "orders-worker-0", AdminURL: broker.AdminURL()})
	if err != nil {
		panic(err)
	}
	defer a.Close()

	// The control server the controller pushes flows to: in a pod, ListenAndServe on the
	// container port named "subflow" (9470) with the mounted token file.
	server, err := control.New(a, control.Options{Token: "example-token"})
	if err != nil {
		panic(err)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = server.Serve(ctx, listener) }()

	// Subscribe through the agent: the result is a pulsar.Consumer.
	consumer, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: "orders", SubscriptionName: "ingest"})
	if err != nil {
		panic(err)
	}
	defer consumer.Close()

	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "orders", DisableBatching: true})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	for i := range 3 {
		if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "order-%d", i)}); err != nil {
			panic(err)
		}
	}

	consumer.Pause() // from here on nothing reaches Receive or Chan
	fmt.Println(consumer.State())
	consumer.Resume()
	receive := func() {
		msg, err := consumer.Receive(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println(consumer.State(), string(msg.Payload()), *msg.Index())
		if err := consumer.Ack(msg); err != nil {
			panic(err)
		}
	}
	for range 3 {
		receive()
	}

	// Replay from broker-entry index 1: the message with that index comes next.
	res, err := consumer.SeekByIndex(ctx, 1)
	if err != nil {
		panic(err)
	}
	fmt.Println("next index", res.Positions[0].Index)
	receive()
	// Output:
	// Paused
	// Running order-0 0
	// Running order-1 1
	// Running order-2 2
	// next index 1
	// Running order-1 1
}
