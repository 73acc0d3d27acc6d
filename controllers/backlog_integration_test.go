package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"k8s.io/apimachinery/pkg/api/meta"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testclock"
)

// TestBacklogAtRiskWarnsBeforeTheBrokerExpiresIt: a paused subscription under a message TTL is
// reported at risk, with the predicted deletion time, before the broker deletes its backlog.
func TestBacklogAtRiskWarnsBeforeTheBrokerExpiresIt(t *testing.T) {
	clk := &testclock.Shifted{} // the broker's
	b, err := pulsartest.New(pulsartest.Options{Clock: clk.Now, MessageExpiryCheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ns := namespace(t, true)
	topic := "persistent://public/default/risk-" + ns
	p, err := podsim.Start(podsim.Options{Name: "worker-0", ServiceURL: b.ServiceURL(), AdminURL: b.AdminURL(),
		Token: testToken, Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 1, StartGated: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const ttl = 600 // within the default one-hour warning lead time
	resp, err := http.Post(b.AdminURL()+"/admin/v2/persistent/public/default/risk-"+ns+"/messageTTL?messageTTL="+fmt.Sprint(ttl),
		"application/json", bytes.NewReader([]byte(fmt.Sprint(ttl))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("setting the TTL: %s", resp.Status)
	}
	produceTo(t, b, topic, 20)

	createPod(t, ns, "worker-0", p.Port)
	flow := newFlow(ns, "risk", topic, subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "BacklogAtRisk", func(f *subflowv1.SubscriptionFlow) bool {
		if !meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionBacklogAtRisk) {
			poke(t, f) // the first push only starts the agent's read
			return false
		}
		return true
	})
	bl := got.Status.Backlog
	if bl == nil || bl.Messages < 19 || bl.DeletionTime == nil || bl.OldestPublishTime == nil || bl.Reporter != "worker-0" {
		t.Fatalf("backlog %+v", bl)
	}
	if want := bl.OldestPublishTime.Add(ttl * time.Second); !bl.DeletionTime.Time.Equal(want) {
		t.Fatalf("deletion predicted at %s, want oldest + TTL = %s", bl.DeletionTime, want)
	}
	c := condition(got, subflowv1.ConditionBacklogAtRisk)
	t.Logf("warning: %s", c.Message)
	waitEvent(t, ns, "risk", "BacklogAtRisk", 1)
	if flowSeries(t, "subflow_flow_backlog_at_risk", ns, "risk")[""] != 1 {
		t.Fatalf("subflow_flow_backlog_at_risk is not 1: %v", flowSeries(t, "subflow_flow_backlog_at_risk", ns, "risk"))
	}

	// The prediction holds: just before it the broker deletes nothing, just after it does.
	before := backlogOf(b, topic)
	clk.Advance(bl.DeletionTime.Sub(clk.Now()) - time.Second)
	b.RunExpiryCheck()
	if n := backlogOf(b, topic); n != before {
		t.Fatalf("backlog went from %d to %d before the predicted deletion", before, n)
	}
	clk.Advance(2 * time.Second)
	b.RunExpiryCheck()
	if n := backlogOf(b, topic); n >= before {
		t.Fatalf("backlog still %d after the predicted deletion", n)
	}
	if c.LastTransitionTime.Time.After(time.Now()) {
		t.Fatal("the warning is dated after the deletion")
	}
}

func backlogOf(b *pulsartest.Broker, topic string) int64 {
	return b.Subscription(topic, "ingest").Backlog
}

func produceTo(t *testing.T, b *pulsartest.Broker, topic string, n int) {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range n {
		if _, err := prod.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
}
