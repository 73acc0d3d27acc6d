package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/podsim"
	"github.com/subflow-dev/subflow/internal/pulsartest"
)

func heldTotal(f *subflowv1.SubscriptionFlow) int64 {
	var n int64
	for _, a := range f.Status.Agents {
		n += a.HeldMessages
	}
	return n
}

// TestFailedSeekDropsNothing: a seek that fails (the broker keeps no entry indexes) leaves
// every message the agents hold where it was; after resume each produced message is delivered
// without any reconnect needed to recover stranded ones.
func TestFailedSeekDropsNothing(t *testing.T) {
	noIndex, err := pulsartest.New(pulsartest.Options{DisableIndexMetadata: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = noIndex.Close() })
	ns := namespace(t, true)
	topic := "noindex-" + ns
	var pods []*podsim.Pod
	for i := range 2 {
		name := fmt.Sprintf("worker-%d", i)
		p, err := podsim.Start(podsim.Options{Name: name, ServiceURL: noIndex.ServiceURL(), AdminURL: noIndex.AdminURL(),
			Token: testToken, Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10,
			ProcessingTime: 5 * time.Millisecond}) // a slow downstream: the client's queue stays full
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		createPod(t, ns, name, p.Port)
		pods = append(pods, p)
	}
	flow := newFlow(ns, "noindex", topic, subflowv1.StateRunning)
	create(t, flow)
	waitFlow(t, flow, "Ready", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) && current(f) })

	// Pause while a backlog streams in, so that the gates hold messages.
	const total = 500
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: noIndex.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for i := range total {
		producer.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))}, nil)
		if i == total/10 {
			patchFlow(t, flow, `{"spec":{"state":"Paused"}}`)
		}
	}
	if err := producer.Flush(); err != nil {
		t.Fatal(err)
	}
	paused := waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) && current(f) })
	held := heldTotal(paused)
	t.Logf("held by the gates at the pause: %d; delivered before it: %d", held, totalReceived(pods...))
	if held == 0 {
		t.Fatal("no message held at the pause: the test would prove nothing")
	}

	patchFlow(t, flow, `{"spec":{"seek":{"id":"replay","index":5}}}`)
	failed := waitFlow(t, flow, "the seek to fail", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionSeekCompleted)
		return c != nil && c.Reason == subflowv1.ReasonIndexMetadataDisabled
	})
	waitEvent(t, ns, "noindex", "SeekFailed", 1)
	if n := flowEvents(t, ns, "noindex")["SeekCompleted"]; n != 0 {
		t.Fatalf("%d SeekCompleted events for a failed seek", n)
	}
	if got := heldTotal(failed); got != held {
		t.Fatalf("held messages went from %d to %d across a failed seek", held, got)
	}
	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	eventually(t, "every message delivered", func() bool { return distinct(pods) == total }, func() string {
		return fmt.Sprintf("%d of %d distinct delivered", distinct(pods), total)
	})
}

func distinct(pods []*podsim.Pod) int {
	seen := map[string]bool{}
	for _, p := range pods {
		for _, payload := range p.Payloads() {
			seen[payload] = true
		}
	}
	return len(seen)
}

// TestSeekToAMissingPartitionFails: the executor's own error is reported as SeekFailed, with the
// agent's message, and the consumers keep running.
func TestSeekToAMissingPartitionFails(t *testing.T) {
	ns := namespace(t, true)
	topic := "nopart-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "nopart", topic, subflowv1.StateRunning)
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "bad", Partitions: []subflowv1.PartitionIndex{{Partition: 3, Index: 5}}}
	create(t, flow)
	got := waitFlow(t, flow, "SeekFailed", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionSeekCompleted)
		return c != nil && c.Reason == subflowv1.ReasonSeekFailed
	})
	if c := condition(got, subflowv1.ConditionSeekCompleted); !strings.Contains(c.Message, "partition 3") {
		t.Fatalf("SeekCompleted message %q does not name the partition", c.Message)
	}
	waitEvent(t, ns, "nopart", "SeekFailed", 1)
	if p.Consumer.State() != protocol.Running {
		t.Fatalf("consumer %s after a failed seek", p.Consumer.State())
	}
}
