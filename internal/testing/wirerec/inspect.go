package wirerec

import (
	"net"
	"time"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// decoded lists the commands whose fields the recorder reads; every other
// frame is recorded by type and size only.
var decoded = map[pb.BaseCommand_Type]bool{
	pb.BaseCommand_CONNECT:                           true,
	pb.BaseCommand_SUBSCRIBE:                         true,
	pb.BaseCommand_FLOW:                              true,
	pb.BaseCommand_MESSAGE:                           true,
	pb.BaseCommand_ACK:                               true,
	pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES: true,
	pb.BaseCommand_SEEK:                              true,
	pb.BaseCommand_CLOSE_CONSUMER:                    true,
	pb.BaseCommand_UNSUBSCRIBE:                       true,
	pb.BaseCommand_GET_LAST_MESSAGE_ID:               true,
	pb.BaseCommand_ACTIVE_CONSUMER_CHANGE:            true,
	pb.BaseCommand_REACHED_END_OF_TOPIC:              true,
	pb.BaseCommand_LOOKUP:                            true,
	pb.BaseCommand_LOOKUP_RESPONSE:                   true,
	pb.BaseCommand_PARTITIONED_METADATA:              true,
	pb.BaseCommand_PRODUCER:                          true,
	pb.BaseCommand_ERROR:                             true,
}

// inspect records a frame and returns the bytes to forward: the frame itself
// or, with RewriteLookups, a lookup answer that routes through the proxy.
func (p *Proxy) inspect(c *proxyConn, dir Direction, frame []byte) []byte {
	e := Event{Time: time.Now(), Conn: c.info.ID, Dir: dir, Size: len(frame)}
	cmdBytes, payload, err := pb.SplitFrame(frame)
	if err == nil {
		e.Type, err = pb.CommandType(cmdBytes)
	}
	if err != nil {
		p.undecodable(e, err)
		return frame
	}
	if !decoded[e.Type] {
		p.record(e, nil)
		return frame
	}
	var cmd pb.BaseCommand
	if err := decodeOptions.Unmarshal(cmdBytes, &cmd); err != nil {
		p.undecodable(e, err)
		return frame
	}
	consumerID := describe(&e, &cmd)
	out := frame
	switch e.Type {
	case pb.BaseCommand_MESSAGE:
		p.describeEntry(&e, payload)
	case pb.BaseCommand_LOOKUP_RESPONSE:
		out = p.lookupAnswer(&e, &cmd, frame)
	case pb.BaseCommand_CLOSE_CONSUMER:
		p.assignedBroker(c, e.URL)
	}
	p.record(e, consumerID)
	return out
}

func (p *Proxy) undecodable(e Event, err error) {
	e.Err = err.Error()
	p.record(e, nil)
	p.report(e.Conn, "%v: undecodable frame of %d bytes forwarded as is: %v", e.Dir, e.Size, err)
}

// describe copies the fields that matter into the event and returns the
// consumer id the command names, if any.
func describe(e *Event, cmd *pb.BaseCommand) *uint64 {
	switch e.Type {
	case pb.BaseCommand_CONNECT:
		e.URL = cmd.GetConnect().GetProxyToBrokerUrl()
	case pb.BaseCommand_SUBSCRIBE:
		s := cmd.GetSubscribe()
		e.RequestID = s.GetRequestId()
		e.Consumer = &Consumer{Topic: s.GetTopic(), Subscription: s.GetSubscription(), Name: s.GetConsumerName(), SubType: s.GetSubType().String()}
		return s.ConsumerId
	case pb.BaseCommand_FLOW:
		e.Permits = cmd.GetFlow().GetMessagePermits()
		return cmd.GetFlow().ConsumerId
	case pb.BaseCommand_MESSAGE:
		m := cmd.GetMessage()
		e.MessageID = messageID(m.GetMessageId())
		e.RedeliveryCount = m.GetRedeliveryCount()
		return m.ConsumerId
	case pb.BaseCommand_ACK:
		a := cmd.GetAck()
		e.Messages = len(a.GetMessageId())
		e.IDs = messageIDs(a.GetMessageId())
		if e.Messages > 0 {
			e.MessageID = e.IDs[0]
		}
		e.Cumulative = a.GetAckType() == pb.CommandAck_Cumulative
		e.RequestID = a.GetRequestId()
		return a.ConsumerId
	case pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES:
		r := cmd.GetRedeliverUnacknowledgedMessages()
		e.Messages = len(r.GetMessageIds())
		e.IDs = messageIDs(r.GetMessageIds())
		return r.ConsumerId
	case pb.BaseCommand_SEEK:
		s := cmd.GetSeek()
		if s.MessageId != nil {
			e.MessageID = messageID(s.GetMessageId())
		}
		e.PublishTime = s.GetMessagePublishTime()
		e.RequestID = s.GetRequestId()
		return s.ConsumerId
	case pb.BaseCommand_CLOSE_CONSUMER:
		cc := cmd.GetCloseConsumer()
		e.RequestID = cc.GetRequestId()
		e.URL = cc.GetAssignedBrokerServiceUrl()
		return cc.ConsumerId
	case pb.BaseCommand_UNSUBSCRIBE:
		e.RequestID = cmd.GetUnsubscribe().GetRequestId()
		return cmd.GetUnsubscribe().ConsumerId
	case pb.BaseCommand_GET_LAST_MESSAGE_ID:
		e.RequestID = cmd.GetGetLastMessageId().GetRequestId()
		return cmd.GetGetLastMessageId().ConsumerId
	case pb.BaseCommand_REACHED_END_OF_TOPIC:
		return cmd.GetReachedEndOfTopic().ConsumerId
	case pb.BaseCommand_ACTIVE_CONSUMER_CHANGE:
		e.Active = cmd.GetActiveConsumerChange().GetIsActive()
		return cmd.GetActiveConsumerChange().ConsumerId
	case pb.BaseCommand_LOOKUP:
		e.Topic = cmd.GetLookupTopic().GetTopic()
		e.RequestID = cmd.GetLookupTopic().GetRequestId()
	case pb.BaseCommand_LOOKUP_RESPONSE:
		e.URL = cmd.GetLookupTopicResponse().GetBrokerServiceUrl()
		e.RequestID = cmd.GetLookupTopicResponse().GetRequestId()
	case pb.BaseCommand_PARTITIONED_METADATA:
		e.Topic = cmd.GetPartitionMetadata().GetTopic()
		e.RequestID = cmd.GetPartitionMetadata().GetRequestId()
	case pb.BaseCommand_PRODUCER:
		e.Topic = cmd.GetProducer().GetTopic()
		e.RequestID = cmd.GetProducer().GetRequestId()
	case pb.BaseCommand_ERROR:
		e.RequestID = cmd.GetError().GetRequestId()
		e.Error = cmd.GetError().GetError().String() + ": " + cmd.GetError().GetMessage()
	}
	return nil
}

func messageIDs(ms []*pb.MessageIdData) []MessageID {
	if len(ms) == 0 {
		return nil
	}
	out := make([]MessageID, len(ms))
	for i, m := range ms {
		out[i] = messageID(m)
	}
	return out
}

func messageID(m *pb.MessageIdData) MessageID {
	return MessageID{Ledger: m.GetLedgerId(), Entry: m.GetEntryId(), Partition: m.GetPartition(), BatchIndex: m.GetBatchIndex()}
}

func (p *Proxy) describeEntry(e *Event, payload []byte) {
	info, err := parseEntry(payload)
	e.Messages, e.EntryIndex = info.messages, info.index
	if err != nil {
		e.Err = err.Error()
		p.report(e.Conn, "MESSAGE %d:%d: %v", e.MessageID.Ledger, e.MessageID.Entry, err)
	}
}

// lookupAnswer learns the broker a lookup names and keeps the client on the
// proxy: unchanged when the broker already routes through its service URL
// or advertises the proxy, rewritten with RewriteLookups, reported
// otherwise, because the client would then bypass the recorder.
func (p *Proxy) lookupAnswer(e *Event, cmd *pb.BaseCommand, frame []byte) []byte {
	resp := cmd.GetLookupTopicResponse()
	switch resp.GetResponse() {
	case pb.CommandLookupTopicResponse_Connect, pb.CommandLookupTopicResponse_Redirect:
	default:
		return frame
	}
	broker, err := hostPort(resp.GetBrokerServiceUrl())
	if err != nil {
		p.report(e.Conn, "lookup answer names no usable broker URL (%q, TLS %q): %v", resp.GetBrokerServiceUrl(), resp.GetBrokerServiceUrlTls(), err)
		return frame
	}
	p.learnBroker(broker)
	if resp.GetProxyThroughServiceUrl() || p.isSelf(broker) {
		return frame
	}
	if !p.opts.RewriteLookups {
		p.report(e.Conn, "lookup answered %s: the client connects there directly and bypasses the recorder; make the broker advertise %s or set RewriteLookups", e.URL, p.ServiceURL())
		return frame
	}
	e.Rewritten = true
	return routeThroughProxy(cmd)
}

// assignedBroker handles a CLOSE_CONSUMER naming the broker to reconnect to
// (PIP-307): a client on a proxied connection asks the proxy for it, one on
// a direct connection dials it and leaves the recorder.
func (p *Proxy) assignedBroker(c *proxyConn, url string) {
	if url == "" {
		return
	}
	broker, err := hostPort(url)
	if err != nil {
		p.report(c.info.ID, "CLOSE_CONSUMER assigns an unusable broker URL %q: %v", url, err)
		return
	}
	p.learnBroker(broker)
	if c.info.ProxiedTo == "" && !p.isSelf(broker) {
		p.report(c.info.ID, "CLOSE_CONSUMER assigns broker %s: the consumer reconnects there directly and bypasses the recorder", url)
	}
}

func (p *Proxy) learnBroker(hostPort string) {
	p.mu.Lock()
	p.brokers[hostPort] = true
	p.mu.Unlock()
}

// isSelf tells whether an advertised host:port is the proxy's listener.
func (p *Proxy) isSelf(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	selfHost, selfPort, _ := net.SplitHostPort(p.Addr())
	if port != selfPort {
		return false
	}
	return host == selfHost || (isLoopback(host) && isLoopback(selfHost))
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
