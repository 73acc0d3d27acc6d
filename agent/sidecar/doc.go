// Package sidecar is the subflow agent in another form: a Pulsar binary-protocol proxy that
// runs next to an application written in any language and gates its consumers on the wire,
// where the agent library gates pulsar-client-go objects. The application's service URL points
// at the sidecar (pulsar://localhost:6650); the sidecar talks to the brokers. The states, their
// generations and the status it reports are those of the agent (agent/protocol), so that the
// control server drives a sidecar Consumer as it drives the agent library's: both are a
// control.Consumer. docs/sidecar.md is the user's documentation; this comment is the map of
// the code.
//
// # Transparent proxy (sidecar.go, conn.go)
//
// Every client connection gets its own broker connection. The first frame must be a CONNECT,
// within Options.HandshakeTimeout; it is forwarded as sent, so the client's own authentication
// (method, data, and later AUTH_CHALLENGE/AUTH_RESPONSE) reaches the broker unchanged and the
// broker authorizes the application as itself. Which broker: lookups go to Options.BrokerURL
// (the upstream) and their answers are changed to proxy_through_service_url, as a Pulsar proxy
// answers, so the client connects to the sidecar again for the topic and names the broker in
// CONNECT.proxy_to_broker_url; the sidecar dials that broker. An upstream whose answers already
// route through its service URL is a Pulsar proxy: the sidecar then dials the upstream and the
// CONNECT names the broker to it. Only brokers that a lookup (or a PIP-307 close) through the
// sidecar named are dialed. Partitioned-metadata lookups, topic discovery and watches,
// producers, acks, schemas, keep-alives and command types this package does not know pass byte
// for byte. With pulsar+ssl:// every broker connection is TLS with the broker's host name
// verified (Options.TLSCAFile).
//
// Frames are bounded by Options.MaxFrameSize in both directions; a frame's buffer grows with the
// bytes that arrive. What clients send is also bounded together: their frames being read share
// Options.FrameMemory, a frame begun must be complete within Options.FrameTimeout, and at most
// Options.MaxConnections are open. Garbage, an oversized frame, a command that does not parse,
// a command the broker could read otherwise than the sidecar (its type given twice, another
// command's field beside its own, a sub-message given twice: frame.go), a first command other
// than CONNECT or no CONNECT at all, and a frame begun and not completed in time close that
// connection, with the reason logged; other connections are not affected. A FLOW for a
// consumer the connection never subscribed is dropped (it can only race a close).
//
// # The frame gate (consumer.go)
//
// SUBSCRIBE, FLOW, CLOSE_CONSUMER and UNSUBSCRIBE from the client, and MESSAGE, SUCCESS, ERROR,
// CLOSE_CONSUMER, LOOKUP_RESPONSE and PONG from the broker are decoded; the rest is only typed.
// Each consumer counts the permits the client granted and the messages it got, withholds FLOW
// and holds MESSAGE while not Running, closes and re-creates its broker side for Stopped, and,
// with Options.StrictPause, closes the client's side so that the client drops its receiver
// queue. The states and invariants are written once, at the top of consumer.go.
//
// The sidecar's own commands use request ids from 1<<62 up, so their answers are told from the
// client's and kept from it; its PING barriers rely on peers answering PINGs in order, after
// every frame before: toward the broker so that SetState(Paused) returns once the last FLOW
// arrived, toward the client so that lookup answers wait until a client told to re-subscribe
// by a strict pause has handled that close (Sidecar.awaitDetaches).
package sidecar
