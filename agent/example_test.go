package agent_test

import (
	"context"
	"fmt"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// An application subscribes through the agent instead of the client and consumes as usual;
// the agent (or the application) pauses and resumes it.
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

	a, err := agent.New(agent.Options{Name: "orders-worker-0", AdminURL: broker.AdminURL()})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	consumer, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: "orders", SubscriptionName: "ingest"})
	if err != nil {
		panic(err)
	}
	defer consumer.Close()

	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "orders"})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("order-1")}); err != nil {
		panic(err)
	}

	consumer.Pause() // from here on nothing reaches Receive or Chan
	fmt.Println(consumer.State())
	consumer.Resume()
	msg, err := consumer.Receive(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(consumer.State(), string(msg.Payload()), *msg.Index())
	// Output:
	// Paused
	// Running order-1 0
}
