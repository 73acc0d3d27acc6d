package wirerec_test

import (
	"context"
	"fmt"
	"net"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// The broker advertises the recorder, so every connection passes through it
// unchanged; the record shows the consumer's initial grant and the entry it
// received.
func Example() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	broker, err := pulsartest.New(pulsartest.Options{AdvertisedURL: "pulsar://" + ln.Addr().String()})
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	rec, err := wirerec.Start(broker.ServiceURL(), wirerec.Options{Listener: ln})
	if err != nil {
		panic(err)
	}
	defer rec.Close()

	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: rec.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: "example", SubscriptionName: "sub", Name: "c1", ReceiverQueueSize: 20})
	if err != nil {
		panic(err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "example"})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("hello")}); err != nil {
		panic(err)
	}
	if _, err := consumer.Receive(context.Background()); err != nil {
		panic(err)
	}
	if err := rec.Barrier(consumer); err != nil {
		panic(err)
	}

	mine := wirerec.Filter{Subscription: "sub", ConsumerName: "c1"}
	for _, f := range rec.Flows(mine) {
		fmt.Println("FLOW", f.Permits, "from", f.Consumer.Name, "on", f.Consumer.Topic)
	}
	fmt.Println("messages delivered:", rec.Delivered(mine), "problems:", rec.Check())
	// Output:
	// FLOW 20 from c1 on persistent://public/default/example
	// messages delivered: 1 problems: <nil>
}
