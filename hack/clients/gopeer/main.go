// Command gopeer is a consumer application with the stock pulsar-client-go and no subflow code,
// for the sidecar's tests: it subscribes, then prints one JSON line per message its application
// receives and acknowledges it. It ends when its standard input closes, so that the test that
// started it never leaves it behind. Its flags match the Java and Python peers in hack/clients.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

var subTypes = map[string]pulsar.SubscriptionType{
	"Exclusive": pulsar.Exclusive, "Shared": pulsar.Shared, "Failover": pulsar.Failover, "Key_Shared": pulsar.KeyShared,
}

func main() {
	url := flag.String("url", "", "service URL")
	topic := flag.String("topic", "", "topic")
	subscription := flag.String("subscription", "", "subscription")
	subType := flag.String("type", "Shared", "Exclusive|Shared|Failover|Key_Shared")
	name := flag.String("name", "", "consumer name")
	queue := flag.Int("queue", 1000, "receiver queue size")
	delayMs := flag.Int("delay-ms", 0, "time the application spends on each message, after reporting it and before acknowledging it")
	flag.Parse()
	delay := time.Duration(*delayMs) * time.Millisecond
	if err := run(*url, *topic, *subscription, *subType, *name, *queue, delay); err != nil {
		fmt.Fprintln(os.Stderr, "gopeer:", err)
		os.Exit(1)
	}
}

func run(url, topic, subscription, subType, name string, queue int, delay time.Duration) error {
	typ, ok := subTypes[subType]
	if !ok {
		return fmt.Errorf("unknown subscription type %q", subType)
	}
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: url})
	if err != nil {
		return err
	}
	defer client.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: subscription, Type: typ, Name: name,
		ReceiverQueueSize: queue, SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		return err
	}
	defer consumer.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	out := &emitter{enc: json.NewEncoder(os.Stdout)}
	out.emit(map[string]string{"event": "ready"})
	for {
		msg, err := consumer.Receive(ctx)
		if err != nil {
			return nil // stdin closed
		}
		at := time.Now().UnixMicro() // when the application got it, before printing
		out.emit(map[string]any{"event": "message", "value": string(msg.Payload()), "id": msg.ID().String(), "atMicros": at})
		time.Sleep(delay) // the application's work on the message
		_ = consumer.Ack(msg)
	}
}

type emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *emitter) emit(v any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(v)
}
