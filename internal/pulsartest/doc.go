// Package pulsartest is a Pulsar broker for tests. It speaks the binary
// protocol to the unmodified pulsar-client-go, serves a subset of the admin
// REST API, keeps topics in memory as ledgers of entries, dispatches by flow
// permits for all four subscription types, and records every FLOW it gets,
// so that tests can assert on the wire what a consumer asked for.
//
// Usage from a test:
//
//	b := pulsartest.Start(t)
//	client, _ := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL()})
//	// ... produce and consume ...
//	flows := b.Flows("my-topic", "my-sub")      // every FLOW, in arrival order
//	stats := b.Subscription("my-topic", "my-sub") // backlog, permits, unacked
//	if err := b.CheckPermitInvariant(); err != nil { t.Fatal(err) }
//
// Semantics worth knowing:
//   - Topic names may be short ("t") or full ("persistent://public/default/t").
//     A partitioned topic's base name aggregates its partitions in Flows and
//     Subscription.
//   - A start or seek message id positions the cursor at that entry, which
//     is delivered again; the client discards what it must, as with Pulsar.
//   - SEEK and reset-cursor disconnect the subscription's consumers
//     (CLOSE_CONSUMER) before answering, as the Java broker does.
//   - Producers are deduplicated by name and sequence id, so a producer that
//     resends after a reconnect does not store duplicates.
//   - Counts: Backlog is in entries (like msgBacklog); Dispatched, Acked,
//     Unacked and permits are in messages (a batch counts its messages).
//
// Not modelled: schemas, transactions, chunking, compression-aware key
// routing, batch-index acks (a partially acked batch stays unacked until the
// client acks the whole entry), delayed delivery, non-persistent topics,
// authentication, topic watchers and the HTTP lookup service.
//
// Regenerate the protocol subset with `go generate ./internal/pulsartest/...`.
package pulsartest
