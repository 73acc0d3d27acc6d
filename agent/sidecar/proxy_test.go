package sidecar

import (
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// A producer and a consumer whose service URL is the sidecar work as against the broker:
// lookups keep them on the sidecar, batches pass unchanged, and every connection the clients
// open for the topic reaches the broker through it.
func TestProducerAndConsumerThroughTheSidecar(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	client := newClient(t, w.url)
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1"})
	sent := produce(t, client, topic, "m", 0, 200)
	got := receiveN(t, cons, len(sent))
	if m := missing(sent, got); len(m) > 0 {
		t.Fatalf("missing %d messages, first %s", len(m), m[0])
	}
	if n := len(w.rec.Consumers(wirerec.Filter{Topic: topic, Subscription: "s"})); n != 1 {
		t.Errorf("SUBSCRIBEs on the broker side: %d, want 1", n)
	}
	if n := len(w.rec.Events(wirerec.Filter{}, pb.BaseCommand_PRODUCER)); n == 0 {
		t.Error("no PRODUCER passed the sidecar to the broker")
	}
	for _, c := range w.rec.Connections() {
		if c.ProxiedTo == "" && len(w.rec.Events(wirerec.Filter{Conn: c.ID}, pb.BaseCommand_SUBSCRIBE, pb.BaseCommand_PRODUCER)) > 0 {
			t.Errorf("connection %d carries a topic without naming its broker: lookups did not route through the sidecar", c.ID)
		}
	}
}

// A partitioned topic: the partitioned-metadata lookup passes, and each partition's consumer
// subscribes through the sidecar.
func TestPartitionedTopicThroughTheSidecar(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	w.createPartitioned(t, topic, 3)
	client := newClient(t, w.url)
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1"})
	sent := produce(t, client, topic, "p", 0, 90)
	got := receiveN(t, cons, len(sent))
	if m := missing(sent, got); len(m) > 0 {
		t.Fatalf("missing %d messages, first %s", len(m), m[0])
	}
	var topics []string
	for _, c := range w.sidecar.Consumers() {
		topics = append(topics, c.Topic())
	}
	slices.Sort(topics)
	want := []string{topic + "-partition-0", topic + "-partition-1", topic + "-partition-2"}
	if !slices.Equal(topics, want) {
		t.Errorf("sidecar consumers %v, want %v", topics, want)
	}
}

// A regex consumer discovers its topics through the sidecar (GET_TOPICS_OF_NAMESPACE passes
// unchanged) and subscribes to each through it.
func TestRegexConsumerThroughTheSidecar(t *testing.T) {
	w := newWorld(t)
	base := uniqueTopic(t)
	topics := []string{base + "-a", base + "-b"}
	client := newClient(t, w.url)
	var sent []string
	for _, topic := range topics {
		sent = append(sent, produce(t, client, topic, topic[len(topic)-1:], 0, 10)...)
	}
	cons := subscribe(t, client, pulsar.ConsumerOptions{TopicsPattern: base + "-.*", SubscriptionName: "s", Name: "regex"})
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("missing %v", m)
	}
	if n := len(w.rec.Events(wirerec.Filter{}, pb.BaseCommand_GET_TOPICS_OF_NAMESPACE)); n == 0 {
		t.Error("no GET_TOPICS_OF_NAMESPACE passed the sidecar")
	}
	if n := len(w.sidecar.Consumers()); n != len(topics) {
		t.Errorf("the sidecar tracks %d consumers, want one per topic (%d)", n, len(topics))
	}
}
