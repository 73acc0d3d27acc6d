// Package chaos runs a seeded, reproducible sequence of random operations over the whole
// system - the envtest API server, a Pulsar broker side with its faults, the real controller
// manager and simulated pods, each with a real agent (or a protocol sidecar) and real
// pulsar-client-go consumers - and checks invariants while it runs and at the end.
//
// The broker side is one of two (brokers.go). By default it is the in-process two-broker test
// cluster (internal/testing/pulsartest): topics move between the brokers (clients follow lookups,
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
//     once on every subscription of its topic (seeks replay, so duplicates are expected); when
//     the broker holds missing messages back (awaitDelivery, unloadHeldBack), the run unloads
//     their topic, reports it and waits once more;
//   - convergence: within a bound after the last operation every matched pod's agent reports
//     the effective state, no unmatched pod holds the flow's rule and the flow is Ready at its
//     generation;
//   - seeks: every seek id ends Succeeded or Failed, and each agent process resets each
//     cursor at most once per seek id;
//   - FLOW permits while paused, read from the wire recorder (internal/testing/wirerec) every agent
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
// Sidecar pods (sidecar.go): one in four pods, drawn from the seed (at least one in a run of
// four pods or more; pod-create draws the kind as well), run an unmodified pulsar-client-go
// application whose client connects to an in-process protocol sidecar (agent/sidecar) in
// strict mode, start-gated as the agent pods are; the sidecar reaches the brokers through the
// same wire recorder, and its control server is the pod's control endpoint (a container port
// named subflow), so the controller drives it unchanged. The nacking group has none: it reads
// its retry-letter topic on the same subscription, which the sidecar sees as a consumer of
// another topic that the flow's spec.topic does not match. The chunked group's pauses outlast
// its incomplete-chunk expiry: its sidecar pods must complete the chunked messages their
// client began (single-permit FLOWs while paused, checkFlows). The run ends with as many pods
// of each group and kind as it began. The checks for them:
//
//   - strict pause is a bound, not zero: the sidecar reports each partition or topic of a
//     consumer on its own, so the state read before Receive is that of the returned message's
//     partition; pulsar-client-go v0.21 clears its receiver queue on a strict pause's
//     re-subscribe but not its message channel (10) nor the message its dispatcher holds, and
//     Stopped takes nothing back (its receiver queue comes on top), so up to those
//     (sidecarLeakBound) may reach the application per partition and reported state. The
//     sidecar has no transition lock to wait on: a state that ends within transitionBound of
//     the hand-over counts as the transition that handed it over. The applications keep up
//     with the producers, so a pause seldom meets a full receiver queue (0 to 2 such receives
//     in a short run): a sidecar that does not take the buffer back (default mode) is not
//     caught by the short run, one that forwards FLOWs while paused is;
//   - nothing lost, convergence: unchanged (convergence reads the sidecar's /state);
//   - seeks: unchanged. The controller prefers agent pods as executors; a sidecar executes
//     with its admin access (sidecar.Admin), whose calls go through the process's admin proxy like an agent's,
//     so the reset count per process and seek id applies;
//   - FLOW permits: stricter, per partition or topic: the sidecar forwards no FLOW while Paused
//     or Stopped, re-subscribes after a reconnect or a seek included (the client's new
//     consumer meets the rules' state first), so the only allowed ones are those at the end
//     of the interval (the resume's, or after Stopped the re-subscribe's owed permits, any
//     number); the chunk bound does not apply;
//   - goroutine and heap growth: unchanged.
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
// All random choices come from one math/rand/v2 source seeded by Config.Seed (the first pods'
// kinds from a second one seeded by it, so that the operations drawn for a seed stay those of
// runs before sidecar pods) and operations are applied one at a time in that order, so a seed
// reproduces the operation sequence. The system's timing is not deterministic: what an operation meets (which seek index the
// delivered prefix allows, whether the previous seek still runs) can differ between runs.
package chaos
