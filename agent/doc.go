// Package agent is the library linked into consumer applications. It wraps pulsar-client-go
// consumers in a gate that can pause, resume, stop and seek them (docs/design.md section 3).
//
// The gate owns the client's MessageChannel (of the client's default size). pulsar-client-go
// returns flow permits to the broker only when its dispatcher pushes a message into that
// channel, so a closed gate plugs it (fills its free slots with placeholders) and no new
// permit flows: the backlog stays on the broker and messages already buffered in the client
// stay there, to be delivered first after Resume. gate.go lists the gate's phases and its
// invariant.
//
// Known limit of pulsar-client-go v0.19: every (re)subscribe grants the receiver queue size Q,
// so a reconnect while paused lets messages into the client, where the gate holds them (none
// reaches the application). A broker with its default configuration reads up to
// min(Q, dispatcherMaxReadBatchSize=100) whole ENTRIES per grant on Exclusive, Failover and
// Key_Shared and debits batch sizes afterwards, so with batches of up to B messages one
// reconnect brings at most Q + min(Q, 100)*(B-1) messages; Shared divides its reads by the
// average batch size: at most Q + B - 1 with equal batches, Q + min(Q, 20)*(B-1) in general.
// Without batching that is Q. Zero-queue consumers get nothing.
//
// Two more things the client would do behind the gate are the agent's: the nack delay, whose
// clock runs only while the gate is open (nack.go), and, for a paused consumer of chunked
// messages, a fresh subscription every half ExpireTimeOfIncompleteChunk so that the client never
// expires and acknowledges an incomplete chunked message (chunks.go). While paused, such a
// consumer's client returns a permit per non-final chunk: at most (Q + P)(K - 1) per session for
// K chunks per message and P messages partly received, plus Q per renewal.
//
// Each Consumer combines three wishes and applies the most restrictive one
// (Stopped > Paused > Running): the application's own (Pause/Resume, Stop/Run), the
// controller's (pushed through agent/control, guarded by a generation so that a stale request
// never undoes a newer one), and the agent's start-up gate (Options.StartGated until the
// controller's first push or the sync timeout).
//
// The application's API is New, Agent.Subscribe and Agent.Close, and the Consumer: the
// pulsar.Consumer methods, Pause, Resume, Stop, Run, State, IsPaused, Status and the seeks by
// index. What the controller applies goes through the control server (agent/control: control.New
// wraps the agent), which reaches the agent through agent/internal/seam; none of it is an
// exported method here.
//
// Backlog at risk: while the controller asks for it, the agent reads, per partition, the
// subscription's backlog (msgBacklog, backlogSize), the entry time of its oldest message
// (earliestMsgPublishTimeInBacklog: the broker timestamp that message TTL compares) and the
// applied message TTL and backlog quotas, through the admin API with the application's
// credentials (agent/internal/pulsaradmin); what it cannot read is Unknown with the reason,
// never an error. The reads run in the background every Options.BacklogRefresh, so that the
// control server answers without waiting. A message TTL
// deletes the oldest message at the broker's first expiry check after oldest + TTL (checks
// run every messageExpiryCheckIntervalInMinutes, 5 by default); a message_age quota with
// consumer_backlog_eviction can act from oldest + 0.9 x limitTime (precise check), a
// destination_storage one when the topic's backlog after its slowest subscription reaches
// limitSize.
package agent
