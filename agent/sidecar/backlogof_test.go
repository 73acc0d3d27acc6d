package sidecar

import (
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// A sidecar pod asked for another subscription's backlog (backlogOf) reads it through the
// pod's admin access like its own: a rule naming a topic needs no consumer in the pod.
func TestSidecarReportsAnotherSubscriptionsBacklog(t *testing.T) {
	w := newWorld(t, Options{Name: "pod-backlog"})
	api := startControl(t, w)
	topic := uniqueTopic(t)
	client := newClient(t, w.brokerTU)
	other, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "other", Type: pulsar.Shared})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	produceUnbatched(t, client, topic, "m", 0, 5)

	rule := protocol.FlowRequest{UID: "uid-1", Revision: 1, Subscription: "s", Topic: topic, State: protocol.Paused,
		BacklogOf: []string{"other"}}
	var st protocol.FlowStatus
	eventually(t, "other's backlog", func() bool {
		st = api.push(t, "shed", rule)
		return len(st.Backlog) == 1
	})
	if b := st.Backlog[0]; b.Subscription != "other" || b.Messages != 5 || b.Unknown != "" || st.Kind != protocol.KindSidecar {
		t.Fatalf("the sidecar reported %+v (kind %s), want other's 5 messages", b, st.Kind)
	}
}
