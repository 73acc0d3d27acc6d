// Package chaos runs a seeded, reproducible sequence of random operations over the whole
// system - the envtest API server, a Pulsar broker side with its faults, the real controller
// manager and simulated pods, each with a real agent and real pulsar-client-go consumers -
// and checks invariants while it runs and at the end.
//
// The broker side is one of two (brokers.go). By default it is the in-process two-broker test
// cluster (internal/pulsartest): topics move between the brokers (clients follow lookups,
// agents follow admin redirects to the owner), a broker drops its connections, unloads a
// topic or answers with latency. With Config.ServiceURL and Config.AdminURL (TestShortRun and
// BenchmarkLongRun take PULSAR_URL and PULSAR_ADMIN_URL, as hack/pulsar/pulsar.sh exec sets
// them; hack/chaos takes -pulsar-url and -admin-url) it is a real Apache Pulsar broker, with
// the run's topics in a namespace created for the run: a topic unload is the admin API's, a
// connection drop cuts every connection at the wire recorder (the agents' clients; the
// producers keep theirs), and topic moves and broker latency are not drawn. Admin faults are
// injected at the agents' admin proxy with either. The checks are the same:
//
//   - strict pause: no message reaches an application while its consumer is continuously
//     Paused or Stopped (the agent's own state and its change timestamp, read before the
//     application's Receive and again after it returned, once the agent finished any
//     transition in progress);
//   - nothing lost: after the final Running every produced message was delivered at least
//     once on every subscription of its topic (seeks replay, so duplicates are expected);
//   - convergence: within a bound after the last operation every matched pod's agent reports
//     the effective state, no unmatched pod holds the flow's rule and the flow is Ready at its
//     generation;
//   - seeks: every seek id ends Succeeded or Failed, and each agent process resets each
//     cursor at most once per seek id;
//   - FLOW permits while paused, read from the wire recorder (internal/wirerec) every agent
//     process's client goes through: none more than a grace period after the pause took
//     effect, except the initial grant of a re-subscribe after a reconnect (the stated
//     bound), and for the chunked group no more than the chunk bound per paused interval
//     (chunkedPauseBound); and the recorder decoded every frame;
//   - no goroutine or heap growth beyond a tolerance between checkpoints.
//
// What the checks cannot see: a message whose Receive began while the consumer ran and that
// returned while a pause was being applied (the hand-over and the pause are not ordered from
// the outside); a state that lasted less than the monitor's sample period (50 ms) for the
// FLOW check; FLOWs in the first 1.5 s after a pause took effect (in flight from before it).
//
// The groups (world.go) cover the message shapes: batches of several sizes, unbatched and
// zero-queue topics, chunked messages on a small queue with a short incomplete-chunk expiry,
// and an application that nacks, reconsumes later (retry-letter topic) and dead-letters.
//
// The producers are harness, not the system under test: they are closed around each broker
// fault (pulsar-client-go v0.19's producer races with itself when it reconnects while
// sending), so broker faults reach the consumers only. The controllers' clock is the wall
// clock moved by operations; after moving it the run touches an annotation of every flow,
// standing in for the requeue a real clock would reach at a window boundary.
//
// All random choices come from one math/rand/v2 source seeded by Config.Seed and operations are
// applied one at a time in that order, so a seed reproduces the operation sequence. The
// system's timing is not deterministic: what an operation meets (which seek index the
// delivered prefix allows, whether the previous seek still runs) can differ between runs.
package chaos
