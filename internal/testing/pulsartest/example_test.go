package pulsartest_test

import (
	"context"
	"fmt"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// A consumer's initial grant is the receiver queue size, visible as its
// first FLOW.
func Example() {
	b, err := pulsartest.New(pulsartest.Options{})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "example"})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: "example", SubscriptionName: "sub", ReceiverQueueSize: 20})
	if err != nil {
		panic(err)
	}
	defer consumer.Close()

	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("hello")}); err != nil {
		panic(err)
	}
	msg, err := consumer.Receive(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(string(msg.Payload()), *msg.Index(), b.Flows("example", "sub")[0].Permits)
	// Output: hello 0 20
}
