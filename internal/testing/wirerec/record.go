package wirerec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Direction says which peer sent a frame.
type Direction int

const (
	FromClient Direction = iota + 1
	FromBroker
)

func (d Direction) String() string {
	switch d {
	case FromClient:
		return "client->broker"
	case FromBroker:
		return "broker->client"
	}
	return "none"
}

// Mark is a point in the record: the sequence number of the last event
// recorded when it was taken. Filter.Since selects what came after it.
type Mark uint64

// ConsumerKey names a consumer on the wire: the client picks the id, unique
// within its connection. A consumer keeps its id when it reconnects, on a new
// connection after a connection loss or on the same one after a
// broker-initiated CLOSE_CONSUMER; each SUBSCRIBE starts a new Consumer.
type ConsumerKey struct {
	Conn uint64
	ID   uint64
}

// Consumer is one subscription of a consumer, from its SUBSCRIBE on.
type Consumer struct {
	ConsumerKey
	Session      Mark // sequence number of the SUBSCRIBE
	Topic        string
	Subscription string
	Name         string
	SubType      string // Exclusive, Shared, Failover or Key_Shared
}

// MessageID is a ledger position as the wire carries it.
type MessageID struct {
	Ledger, Entry uint64
	Partition     int32
	BatchIndex    int32
}

// Event is one recorded frame. Fields that do not apply to its type are zero.
type Event struct {
	Seq  Mark
	Time time.Time
	Conn uint64
	Dir  Direction
	Type pb.BaseCommand_Type
	Size int // bytes on the wire, length prefix included

	// Consumer is the subscription the command is about, as known when the
	// frame passed: set for the commands that carry a consumer id. It is
	// shared by the events of that subscription: read it, do not change it.
	Consumer *Consumer

	// AfterClose marks a command for a subscription that a CLOSE_CONSUMER
	// (either way) had already ended, such as a FLOW racing the close: it
	// was on the wire, but a broker ignores it.
	AfterClose bool

	Permits         uint32      // FLOW
	Messages        int         // MESSAGE: messages in the entry; ACK, REDELIVER: ids listed
	MessageID       MessageID   // MESSAGE; SEEK target; first id of an ACK
	IDs             []MessageID // ACK, REDELIVER: every id listed
	EntryIndex      *uint64     // MESSAGE: broker-entry index, nil when absent
	RedeliveryCount uint32      // MESSAGE
	PublishTime     uint64      // SEEK by time
	Cumulative      bool        // ACK
	Active          bool        // ACTIVE_CONSUMER_CHANGE
	RequestID       uint64
	Topic           string // LOOKUP, PARTITIONED_METADATA, PRODUCER
	URL             string // LOOKUP_RESPONSE broker, CONNECT proxy_to_broker_url, CLOSE_CONSUMER assigned broker
	Rewritten       bool   // LOOKUP_RESPONSE changed to route through the proxy
	Error           string // ERROR: code and message the broker sent
	Err             string // what could not be decoded; the frame was forwarded anyway
}

// Filter selects events and consumers; zero fields match anything.
type Filter struct {
	// Topic matches a short ("t"), full ("persistent://public/default/t")
	// or partitioned base name, which includes every partition.
	Topic        string
	Subscription string
	ConsumerName string
	Consumer     *ConsumerKey
	Conn         uint64
	Since        Mark // only what was recorded after this mark
}

func (f Filter) matchConsumer(c *Consumer) bool {
	if f.Topic != "" || f.Subscription != "" || f.ConsumerName != "" || f.Consumer != nil {
		if c == nil {
			return false
		}
	}
	if c == nil {
		return true
	}
	return (f.Topic == "" || topicMatches(f.Topic, c.Topic)) &&
		(f.Subscription == "" || f.Subscription == c.Subscription) &&
		(f.ConsumerName == "" || f.ConsumerName == c.Name) &&
		(f.Consumer == nil || *f.Consumer == c.ConsumerKey)
}

func (f Filter) match(e *Event) bool {
	return e.Seq > f.Since && (f.Conn == 0 || f.Conn == e.Conn) && f.matchConsumer(e.Consumer)
}

// topicMatches tells whether a subscribed topic is the wanted one or one of
// its partitions.
func topicMatches(want, got string) bool {
	want, got = fullTopicName(want), fullTopicName(got)
	if want == got {
		return true
	}
	base, suffix, ok := strings.Cut(got, "-partition-")
	if !ok || base != want {
		return false
	}
	_, err := strconv.Atoi(suffix)
	return err == nil
}

// fullTopicName expands Pulsar's short forms: "t" and "tenant/ns/t".
func fullTopicName(name string) string {
	if strings.Contains(name, "://") {
		return name
	}
	if strings.Count(name, "/") == 2 {
		return "persistent://" + name
	}
	return "persistent://public/default/" + name
}

// problem is something a test should hear about: traffic the recorder could
// not decode, or a lookup that sends the client around the proxy.
type problem struct {
	conn uint64
	what string
}

func (p problem) String() string { return fmt.Sprintf("connection %d: %s", p.conn, p.what) }

// Events returns the recorded events the filter selects, in recording order,
// restricted to the given types when any are named.
func (p *Proxy) Events(f Filter, types ...pb.BaseCommand_Type) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Event
	for i := range p.events {
		e := &p.events[i]
		if !f.match(e) {
			continue
		}
		if len(types) > 0 && !containsType(types, e.Type) {
			continue
		}
		out = append(out, *e)
	}
	return out
}

func containsType(types []pb.BaseCommand_Type, t pb.BaseCommand_Type) bool {
	for _, x := range types {
		if x == t {
			return true
		}
	}
	return false
}

// Flows returns the FLOW commands the filter selects.
func (p *Proxy) Flows(f Filter) []Event { return p.Events(f, pb.BaseCommand_FLOW) }

// Permits sums the permits of the FLOW commands the filter selects.
func (p *Proxy) Permits(f Filter) int64 {
	var sum int64
	for _, e := range p.Flows(f) {
		sum += int64(e.Permits)
	}
	return sum
}

// Messages returns the MESSAGE frames (one per entry) the filter selects.
func (p *Proxy) Messages(f Filter) []Event { return p.Events(f, pb.BaseCommand_MESSAGE) }

// Delivered counts the messages in the MESSAGE frames the filter selects: a
// batch entry counts its messages, as the broker debits permits.
func (p *Proxy) Delivered(f Filter) int {
	n := 0
	for _, e := range p.Messages(f) {
		n += e.Messages
	}
	return n
}

// Consumers returns the subscriptions (one per SUBSCRIBE) the filter
// selects, in order.
func (p *Proxy) Consumers(f Filter) []Consumer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Consumer
	for _, c := range p.sessions {
		if c.Session > f.Since && (f.Conn == 0 || f.Conn == c.Conn) && f.matchConsumer(c) {
			out = append(out, *c)
		}
	}
	return out
}

// Mark returns the current end of the record.
func (p *Proxy) Mark() Mark {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Check reports what a test should not ignore: frames that could not be
// decoded, streams that stopped looking like Pulsar frames, lookups that sent
// the client straight to a broker, and a record that hit its size limit.
func (p *Proxy) Check() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, 0, len(p.problems)+1)
	for _, pr := range p.problems {
		errs = append(errs, errors.New(pr.String()))
	}
	if p.dropped > 0 {
		errs = append(errs, fmt.Errorf("record full: %d events not kept (Options.MaxEvents = %d)", p.dropped, p.opts.MaxEvents))
	}
	return errors.Join(errs...)
}

// record appends an event, attributing it to the consumer it names.
func (p *Proxy) record(e Event, consumerID *uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	e.Seq = p.seq
	if consumerID != nil {
		key := ConsumerKey{Conn: e.Conn, ID: *consumerID}
		if e.Type == pb.BaseCommand_SUBSCRIBE {
			e.Consumer.ConsumerKey = key
			e.Consumer.Session = e.Seq
			p.current[key] = e.Consumer
			p.sessions = append(p.sessions, e.Consumer)
		} else if c := p.current[key]; c != nil {
			e.Consumer = c
			e.AfterClose = p.closedCs[c]
		} else {
			e.Consumer = &Consumer{ConsumerKey: key} // a consumer whose SUBSCRIBE was not seen
		}
	}
	if e.Type == pb.BaseCommand_CLOSE_CONSUMER && e.Consumer != nil {
		p.closedCs[e.Consumer] = true
	}
	if len(p.opts.Keep) > 0 && !containsType(p.opts.Keep, e.Type) && e.Type != pb.BaseCommand_GET_LAST_MESSAGE_ID {
		return
	}
	if len(p.events) >= p.opts.MaxEvents {
		p.dropped++
		return
	}
	p.events = append(p.events, e)
}

func (p *Proxy) report(conn uint64, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.problems) < maxProblems {
		p.problems = append(p.problems, problem{conn: conn, what: fmt.Sprintf(format, args...)})
	}
}

const maxProblems = 100
