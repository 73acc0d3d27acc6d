// Command consumer is the reference application for subflow: a Pulsar consumer whose
// subscription a SubscriptionFlow can pause, stop and seek. Three changes to an ordinary
// pulsar-client-go consumer: create an agent, start its control server, and subscribe through
// the agent instead of the client.
//
// Configuration comes from the environment, as in a pod:
//
//	PULSAR_URL          pulsar://pulsar:6650
//	PULSAR_ADMIN_URL    http://pulsar:8080   (for seek by index)
//	TOPIC, SUBSCRIPTION the subscription to consume
//	POD_NAME            from the downward API; how the agent reports itself
//	SUBFLOW_TOKEN_FILE  the mounted key of Secret subflow-agent-token (default /var/run/subflow/token)
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
)

func main() {
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error(err, "Consumer failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, log logr.Logger) error {
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: env("PULSAR_URL", "pulsar://localhost:6650")})
	if err != nil {
		return err
	}
	defer client.Close()

	// 1. The agent: consumers start paused until the controller's first push (bounded), so a pod
	//    scaled up during an incident does not consume before the controller reaches it.
	subflow, err := agent.New(agent.Options{
		Name:       env("POD_NAME", "local"),
		AdminURL:   env("PULSAR_ADMIN_URL", "http://localhost:8080"),
		Logger:     log,
		Registerer: prometheus.DefaultRegisterer,
		StartGated: true,
	})
	if err != nil {
		return err
	}
	defer subflow.Close()

	// 2. The control server on the container port named "subflow" (9470).
	server, err := control.New(subflow, control.Options{TokenFile: env("SUBFLOW_TOKEN_FILE", "/var/run/subflow/token"), Logger: log})
	if err != nil {
		return err
	}
	go func() {
		if err := server.ListenAndServe(ctx); err != nil {
			log.Error(err, "Control server stopped")
		}
	}()

	// 3. Subscribe through the agent; the result is a pulsar.Consumer.
	var consumer pulsar.Consumer
	consumer, err = subflow.Subscribe(client, pulsar.ConsumerOptions{
		Topic:            env("TOPIC", "orders"),
		SubscriptionName: env("SUBSCRIPTION", "orders-ingest"),
		Type:             pulsar.Shared,
	})
	if err != nil {
		return err
	}
	defer consumer.Close()

	for {
		msg, err := consumer.Receive(ctx) // blocks while the flow is Paused or Stopped
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		process(msg)
		if err := consumer.Ack(msg); err != nil {
			log.Error(err, "Ack failed", "messageID", msg.ID().String())
		}
	}
}

func process(msg pulsar.Message) {
	fmt.Printf("%s %s\n", msg.ID(), msg.Payload())
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
