package pulsartest

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// clientsOn counts the producers and consumers connected to one broker.
func clientsOn(b *Broker) (producers, consumers int) {
	b.mu.Lock()
	conns := slices.Collect(maps.Keys(b.conns))
	b.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		producers += len(c.producers)
		consumers += len(c.consumers)
		c.mu.Unlock()
	}
	return producers, consumers
}

// The real client follows LOOKUP_RESPONSE Redirect (lookup_service.go) to
// the broker the leader assigns, and produces and consumes there, whichever
// broker its service URL names: the leader redirecting with
// authoritative=true, or a follower sending it to the leader first (two
// redirects when the leader then assigns a third broker).
func TestClusterServesATopicFromItsOwnerWhateverTheServiceURL(t *testing.T) {
	for _, tc := range []struct{ serviceURL, owner int }{{0, 1}, {1, 0}, {1, 2}} {
		t.Run(fmt.Sprintf("service-url-%d-owner-%d", tc.serviceURL, tc.owner), func(t *testing.T) {
			cl := StartCluster(t, 3)
			topic := "owned-elsewhere"
			if err := cl.MoveTopic(topic, tc.owner); err != nil {
				t.Fatal(err)
			}
			c := testkit.NewClient(t, cl.Broker(tc.serviceURL).ServiceURL())
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: topic}), "m", 10)
			if got := payloads(testkit.ReceiveAndAck(t, cons, 10, waitFor)); got[0] != "m-0" || got[9] != "m-9" {
				t.Fatalf("received %v", got)
			}
			if got := cl.Owner(topic); got != tc.owner {
				t.Fatalf("owner is broker %d, want %d", got, tc.owner)
			}
			if p, s := clientsOn(cl.Broker(tc.owner)); p != 1 || s != 1 {
				t.Fatalf("owner has %d producers and %d consumers, want 1 and 1", p, s)
			}
			if p, s := clientsOn(cl.Broker(tc.serviceURL)); p != 0 || s != 0 {
				t.Fatalf("non-owner has %d producers and %d consumers", p, s)
			}
		})
	}
}

func lookup(rc *rawClient, topic string, requestID uint64, authoritative bool) *pb.CommandLookupTopicResponse {
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pb.CommandLookupTopic{
		Topic: ptr(topic), RequestId: ptr(requestID), Authoritative: ptr(authoritative),
	}})
	return rc.await("lookup response", func(c *pb.BaseCommand) bool {
		return c.GetLookupTopicResponse().GetRequestId() == requestID
	}).GetLookupTopicResponse()
}

// The lookup answers of NamespaceService.findBrokerServiceUrl /
// searchForCandidateBroker and TopicLookupBase.lookupTopicAsync.
func TestClusterLookupAnswers(t *testing.T) {
	cl := StartCluster(t, 2)
	leader, follower := dialRaw(t, cl.Broker(0)), dialRaw(t, cl.Broker(1))
	b0, b1 := cl.Broker(0).ServiceURL(), cl.Broker(1).ServiceURL()
	if err := cl.MoveTopic("to-follower", 1); err != nil {
		t.Fatal(err)
	}
	if err := cl.MoveTopic("to-leader", 0); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		kind          pb.CommandLookupTopicResponse_LookupType
		url           string
		authoritative bool
	}
	got := func(r *pb.CommandLookupTopicResponse) answer {
		return answer{r.GetResponse(), r.GetBrokerServiceUrl(), r.GetAuthoritative()}
	}
	steps := []struct {
		name          string
		rc            *rawClient
		topic         string
		authoritative bool
		want          answer
	}{
		// An unowned topic: the follower sends the client to the leader.
		{"follower, unowned", follower, "to-leader", false, answer{pb.CommandLookupTopicResponse_Redirect, b0, false}},
		// The leader's load manager picks itself: it acquires and connects.
		{"leader acquires", leader, "to-leader", false, answer{pb.CommandLookupTopicResponse_Connect, b0, true}},
		// Owned: any broker answers Connect with the owner (LookupResult of type BrokerUrl).
		{"follower, owned by leader", follower, "to-leader", false, answer{pb.CommandLookupTopicResponse_Connect, b0, true}},
		// The leader assigns another broker: Redirect there, authoritative.
		{"leader, unowned", leader, "to-follower", false, answer{pb.CommandLookupTopicResponse_Redirect, b1, true}},
		// The authoritative lookup makes the follower acquire it.
		{"follower acquires", follower, "to-follower", true, answer{pb.CommandLookupTopicResponse_Connect, b1, true}},
		{"leader, owned by follower", leader, "to-follower", false, answer{pb.CommandLookupTopicResponse_Connect, b1, true}},
	}
	for i, s := range steps {
		if a := got(lookup(s.rc, s.topic, uint64(i+1), s.authoritative)); a != s.want {
			t.Fatalf("%s: got %+v, want %+v", s.name, a, s.want)
		}
	}
	if cl.Owner("to-leader") != 0 || cl.Owner("to-follower") != 1 {
		t.Fatalf("owners %d and %d", cl.Owner("to-leader"), cl.Owner("to-follower"))
	}
}

// BrokerService.checkTopicNsOwnership: a broker refuses a producer or a
// consumer for a topic it does not own with ServiceNotReady.
func TestClusterNonOwnerRefusesProducersAndConsumers(t *testing.T) {
	cl := StartCluster(t, 2)
	if err := cl.MoveTopic("refused", 1); err != nil {
		t.Fatal(err)
	}
	testkit.Produce(t, testkit.NewProducer(t, testkit.NewClient(t, cl.Broker(1).ServiceURL()), pulsar.ProducerOptions{Topic: "refused"}), "m", 1)
	rc := dialRaw(t, cl.Broker(0))
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
		Topic: ptr("refused"), ProducerId: ptr(uint64(1)), RequestId: ptr(uint64(11)),
	}})
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
		Topic: ptr("refused"), Subscription: ptr("sub"), SubType: pb.CommandSubscribe_Shared.Enum(),
		ConsumerId: ptr(uint64(2)), RequestId: ptr(uint64(12)),
	}})
	for _, req := range []uint64{11, 12} {
		e := rc.await("refusal", func(c *pb.BaseCommand) bool { return c.GetError().GetRequestId() == req }).GetError()
		if e.GetError() != pb.ServerError_ServiceNotReady || !strings.Contains(e.GetMessage(), "not served by this instance") {
			t.Fatalf("request %d: %v %q", req, e.GetError(), e.GetMessage())
		}
	}
	if p, s := clientsOn(cl.Broker(0)); p != 0 || s != 0 {
		t.Fatalf("non-owner registered %d producers and %d consumers", p, s)
	}
}

// PulsarWebResource.validateTopicOwnershipAsync: an admin call for a topic
// to a non-owner answers 307 to the owner's admin URL with the same path and
// query, authoritative set to whether the redirecting broker is the leader.
func TestClusterAdminCallToNonOwnerRedirectsToTheOwner(t *testing.T) {
	cl := StartCluster(t, 3)
	if err := cl.MoveTopic("adm", 2); err != nil {
		t.Fatal(err)
	}
	testkit.Produce(t, testkit.NewProducer(t, testkit.NewClient(t, cl.Broker(0).ServiceURL()), pulsar.ProducerOptions{Topic: "adm"}), "m", 3)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, from := range []int{0, 1} {
		path := "/admin/v2/persistent/public/default/adm/stats?getEarliestTimeInBacklog=true"
		resp, err := noFollow.Get(cl.Broker(from).AdminURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		want := fmt.Sprintf("%s/admin/v2/persistent/public/default/adm/stats?authoritative=%t&getEarliestTimeInBacklog=true", cl.Broker(2).AdminURL(), from == 0)
		if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != want {
			t.Fatalf("from broker %d: %d Location %q, want 307 %q", from, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	// A client that follows redirects reaches the owner's answer.
	var stats topicStatsJSON
	testkit.GetJSON(t, cl.Broker(0).AdminURL()+"/admin/v2/persistent/public/default/adm/stats", &stats)
	if stats.MsgInCounter != 3 {
		t.Fatalf("stats through the redirect: %+v", stats)
	}
	// Namespace policies and partition metadata need no owner.
	if code := getCode(t, cl.Broker(1).AdminURL()+"/admin/v2/namespaces/public/default/backlogQuotaMap"); code != http.StatusOK {
		t.Fatalf("namespace policy on a follower: %d", code)
	}
}

// Moving a topic closes its producers and consumers; they look it up again,
// reach the new owner and go on: every message arrives.
func TestClusterMoveTopicMidStreamLosesNoMessage(t *testing.T) {
	cl := StartCluster(t, 2)
	const topic, total = "moving", 300
	if err := cl.MoveTopic(topic, 1); err != nil {
		t.Fatal(err)
	}
	c := testkit.NewClient(t, cl.Broker(0).ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared})
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: topic})

	// The producer moves the topic when a third is sent and moves it back
	// at two thirds: both the producer and the consumer are mid-stream then.
	var wg sync.WaitGroup
	sendErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range total {
			if to, ok := map[int]int{total / 3: 0, 2 * total / 3: 1}[i]; ok {
				if err := cl.MoveTopic(topic, to); err != nil {
					sendErr <- err
					return
				}
			}
			if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))}); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	defer cancel()
	for len(seen) < total {
		m, err := cons.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d distinct of %d: %v", len(seen), total, err)
		}
		_ = cons.Ack(m)
		seen[string(m.Payload())] = true
	}
	wg.Wait()
	select {
	case err := <-sendErr:
		t.Fatal(err)
	default:
	}
	if cl.Owner(topic) != 1 {
		t.Fatalf("owner %d after the moves", cl.Owner(topic))
	}
	if p, s := clientsOn(cl.Broker(0)); p != 0 || s != 0 {
		t.Fatalf("old owner still has %d producers and %d consumers", p, s)
	}
	if p, s := clientsOn(cl.Broker(1)); p != 1 || s != 1 {
		t.Fatalf("new owner has %d producers and %d consumers, want 1 and 1", p, s)
	}
}

// Each partition is owned on its own: a partitioned topic spread over two
// brokers is produced and consumed as one.
func TestClusterPartitionsOwnedByDifferentBrokers(t *testing.T) {
	cl := StartCluster(t, 2)
	if err := cl.Broker(0).CreatePartitionedTopic("spread", 2); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := cl.MoveTopic(partitionName(mustFull("spread"), i), i); err != nil {
			t.Fatal(err)
		}
	}
	c := testkit.NewClient(t, cl.Broker(1).ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "spread", SubscriptionName: "sub"})
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "spread", DisableBatching: true})
	for i := range 20 {
		msg := &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i), Payload: []byte(fmt.Sprintf("m-%d", i))}
		if _, err := p.Send(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	got := testkit.ReceiveAndAck(t, cons, 20, waitFor)
	partitions := map[int32]bool{}
	for _, m := range got {
		partitions[m.ID().PartitionIdx()] = true
	}
	if len(partitions) != 2 {
		t.Fatalf("messages from partitions %v", partitions)
	}
	for i := range 2 {
		if o := cl.Owner(partitionName(mustFull("spread"), i)); o != i {
			t.Fatalf("partition %d owned by %d", i, o)
		}
		if _, s := clientsOn(cl.Broker(i)); s != 1 {
			t.Fatalf("broker %d has %d consumers, want its partition's one", i, s)
		}
	}
}

// ServerCnx.handleSend: SENDs still in flight for a producer the broker
// closed are ignored (recentlyClosedProducers); the connection stays up and
// the client sends them again once it has reconnected.
func TestSendForAProducerClosedByUnloadIsIgnored(t *testing.T) {
	b := Start(t)
	rc := dialRaw(t, b)
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
		Topic: ptr("unloaded"), ProducerId: ptr(uint64(1)), RequestId: ptr(uint64(1)),
	}})
	rc.await("producer ready", func(c *pb.BaseCommand) bool { return c.GetProducerSuccess().GetRequestId() == 1 })
	if err := b.UnloadTopic("unloaded"); err != nil {
		t.Fatal(err)
	}
	rc.await("CLOSE_PRODUCER", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_CLOSE_PRODUCER })
	meta := &pb.MessageMetadata{ProducerName: ptr("p"), SequenceId: ptr(uint64(0)), PublishTime: ptr(uint64(1))}
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(), Send: &pb.CommandSend{ProducerId: ptr(uint64(1)), SequenceId: ptr(uint64(0))}},
		sendPayload(meta, []byte("late")))
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PING.Enum(), Ping: &pb.CommandPing{}})
	rc.await("PONG after the late SEND", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_PONG })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, c := range rc.frames {
		if c.GetType() == pb.BaseCommand_SEND_ERROR || c.GetType() == pb.BaseCommand_SEND_RECEIPT {
			t.Fatalf("the late SEND was answered: %v", c)
		}
	}
	if n := b.Subscription("unloaded", "none").Backlog; n != 0 || len(b.topicsNamed("unloaded")[0].entries) != 0 {
		t.Fatal("the late SEND was stored")
	}
}
