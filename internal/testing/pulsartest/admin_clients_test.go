package pulsartest

import (
	"context"
	"errors"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// The admin calls as pulsaradmin sends them. ExtPersistentTopics.createPartitionedTopic takes a
// PartitionedTopicMetadata body ({"properties":...,"partitions":N}); PersistentTopicsBase.getStats writes
// each producer's and consumer's metadata and clientVersion, and partitioned-stats, per
// partition by default, its "partitions" map; PersistentTopics.deletePartitionedTopic refuses
// while clients are connected (412) unless forced; PersistentTopics.terminate answers the last
// message id and PersistentTopic.terminate disconnects the producers, which are then refused
// (TopicTerminatedError).
func TestAdminAsPulsaradminSendsIt(t *testing.T) {
	b := Start(t)
	a := newAdmin(t, b)
	parts := adminTopic(t, "admin-parts")
	if err := a.Topics().CreateWithProperties(parts, 2, map[string]string{"team": "a"}); err != nil {
		t.Fatalf("create partitioned topic: %v", err)
	}
	meta, err := a.Topics().GetMetadata(parts)
	if err != nil || meta.Partitions != 2 {
		t.Fatalf("partition metadata %+v, %v", meta, err)
	}

	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "admin-parts", Properties: map[string]string{"p": "1"}, DisableBatching: true})
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "admin-parts", SubscriptionName: "sub", Properties: map[string]string{"c": "2"}})
	testkit.Produce(t, p, "m", 2)
	st, err := a.Topics().GetPartitionedStats(parts, true)
	if err != nil || len(st.Partitions) != 2 {
		t.Fatalf("partitioned stats per partition: %d partitions, %v", len(st.Partitions), err)
	}
	one := st.Partitions["persistent://public/default/admin-parts-partition-0"]
	if len(one.Publishers) != 1 || one.Publishers[0].Metadata["p"] != "1" || one.Publishers[0].ClientVersion == "" {
		t.Fatalf("partition-0 publishers %+v", one.Publishers)
	}
	if cs := one.Subscriptions["sub"].Consumers; len(cs) != 1 || cs[0].Metadata["c"] != "2" || cs[0].ClientVersion == "" {
		t.Fatalf("partition-0 consumers %+v", cs)
	}

	if err := a.Topics().Delete(parts, false, false); err == nil {
		t.Fatal("a partitioned topic with clients connected was deleted without force")
	}
	p.Close()
	cons.Close()
	if err := a.Topics().Delete(parts, false, false); err != nil {
		t.Fatalf("delete partitioned topic: %v", err)
	}
	if meta, err := a.Topics().GetMetadata(parts); err == nil && meta.Partitions != 0 {
		t.Fatalf("after delete: %+v", meta)
	}

	single := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "admin-terminate", DisableBatching: true})
	ids := testkit.Produce(t, single, "t", 2)
	last, err := a.Topics().Terminate(adminTopic(t, "admin-terminate"))
	if err != nil || last.LedgerID != ids[1].LedgerID() || last.EntryID != ids[1].EntryID() {
		t.Fatalf("terminate answered %+v, %v; want the last message %v", last, err, ids[1])
	}
	testkit.Eventually(t, waitFor, "the producer closed as terminated", func() bool {
		_, err := single.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("late")})
		return errors.Is(err, pulsar.ErrTopicTerminated) || errors.Is(err, pulsar.ErrProducerClosed)
	})
	if _, err := c.CreateProducer(pulsar.ProducerOptions{Topic: "admin-terminate"}); err == nil {
		t.Fatal("a producer was admitted on a terminated topic")
	}
}
