// Package wirerec is a wire recorder for the Pulsar binary protocol: a TCP
// proxy between pulsar-client-go and a broker (pulsartest or a real Pulsar)
// that forwards every byte unchanged and records, per connection and
// consumer, the commands that show what a consumer asked for and got:
// SUBSCRIBE, FLOW, MESSAGE (with the messages in the entry), ACK,
// REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK, CLOSE_CONSUMER (both
// directions), UNSUBSCRIBE, GET_LAST_MESSAGE_ID and ACTIVE_CONSUMER_CHANGE.
// Other frames are recorded by type and size. Payloads are not kept.
//
// # Staying in the path
//
// The client sends lookups to its service URL, then opens the topic's
// connection to the broker the LOOKUP_RESPONSE names (pulsar-client-go
// lookup_service.go, GetBrokerAddress). A broker that names itself takes the
// client around the proxy. Two ways keep it in the path.
//
// First way, no byte changed (preferred): the broker advertises the proxy.
// Bind the proxy's listener first, give its address to the broker, then
// start the proxy on it:
//
//	ln, _ := net.Listen("tcp", "127.0.0.1:0")
//	b := pulsartest.Start(t, pulsartest.Options{AdvertisedURL: "pulsar://" + ln.Addr().String()})
//	p := wirerec.StartT(t, b.ServiceURL(), wirerec.Options{Listener: ln})
//	client, _ := pulsar.NewClient(pulsar.ClientOptions{URL: p.ServiceURL()})
//
// A real broker does the same with an advertised listener whose address is
// the proxy's (advertisedListeners, and ClientOptions.ListenerName), or with
// advertisedAddress when the proxy listens on the broker's port on another
// host.
//
// Second way, Options.RewriteLookups: the proxy sets
// proxy_through_service_url in Connect and Redirect lookup answers. The
// client then dials its service URL (the proxy) for the topic and names the
// broker in CONNECT.proxy_to_broker_url (connection.go), the mechanism a
// Pulsar proxy uses; the proxy dials that broker. Those lookup answers are
// the only bytes ever changed; the CONNECT is forwarded as sent, field
// included (a broker does not read it: the Java broker's
// ServerCnx.handleConnect reads features, proxy version and authentication;
// pulsartest ignores it). This needs no broker setting, so it suits a real
// Pulsar that advertises itself, and it follows redirects between several
// brokers.
//
// CONNECTED names no broker. A CLOSE_CONSUMER may name the broker to
// reconnect to (assignedBrokerServiceUrl, PIP-307): the client goes there
// through the proxy only if its connection was proxied. The proxy dials only
// its upstream and brokers named by lookup answers or such closes that
// passed through it; a CONNECT naming another host is refused. Check
// reports every lookup or close that sends a client around the proxy.
//
// # Reading the record
//
// A consumer on the wire is (connection, consumer id): the client picks the
// id and keeps it for the consumer's life. After a lost connection it
// subscribes again on a new connection with the same id; after a
// broker-initiated CLOSE_CONSUMER (seek, unload) on the same connection with
// the same id. Every SUBSCRIBE starts a new Consumer (its Session is the
// SUBSCRIBE's sequence number), carrying topic, subscription, consumer name
// and type; the commands that follow are attributed to it.
//
//	mark := p.Mark()
//	// ... act ...
//	p.Permits(wirerec.Filter{Subscription: "sub", ConsumerName: "c1", Since: mark})
//	p.Delivered(wirerec.Filter{Topic: "t"}) // messages, a batch counting its messages
//	p.Consumers(wirerec.Filter{Topic: "t"})   // every SUBSCRIBE, in order
//
// Filter.Topic accepts short or full names; a partitioned topic's base name
// includes its partitions. Delivered counts num_messages_in_batch of each
// MESSAGE, which is what a broker debits from permits. The record is what
// was on the wire: a command for a subscription that a CLOSE_CONSUMER had
// already ended (a FLOW racing the close) is kept and marked AfterClose,
// because a broker ignores it.
//
// Each frame is recorded before it is forwarded, so whatever a peer has
// received is in the record. To be sure the record holds every command a
// consumer had queued before some point, call Barrier(consumer): it
// completes a GET_LAST_MESSAGE_ID round trip on each of the consumer's
// connections, which the client orders after the commands queued before it
// (see Barrier). Nothing covers a command the client has not queued yet: wait
// for it with a deadline.
//
// # Forwarding
//
// Frames are forwarded in order, as they came, and written as soon as the
// sender has nothing more buffered, so batching on the wire is kept and
// latency is one local hop. A frame cut short by a closing peer is passed on
// as far as it came. A connection whose first frame is not whole is closed
// without dialing a broker (a broker would expect a CONNECT there too). A
// stream that later stops looking like Pulsar framing (a
// length below 4 or above 64 MiB) is forwarded undecoded from there on. When
// either side ends, both connections are closed. Check reports undecodable
// frames and truncated streams.
//
// Not supported: TLS (pulsar+ssl) and the HTTP lookup service. The record
// keeps at most Options.MaxEvents events (Check reports an overflow).
package wirerec
