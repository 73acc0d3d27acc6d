// Package agent is the library linked into consumer applications. It wraps pulsar-client-go
// consumers in a gate that can pause, resume, stop and seek them (DESIGN.md section 3).
//
// The gate owns the client's MessageChannel (of the client's default size). pulsar-client-go
// returns flow permits to the broker only when its dispatcher pushes a message into that
// channel, so a closed gate plugs it (fills its free slots with placeholders) and no new
// permit flows: the backlog stays on the broker and messages already buffered in the client
// stay there, to be delivered first after Resume. gate.go lists the gate's phases and its
// invariant.
//
// Each Consumer combines three wishes and applies the most restrictive one
// (Stopped > Paused > Running): the application's own (Pause/Resume, Stop/Run), the controller's
// (SetState, guarded by a generation so that a stale request never undoes a newer one), and the
// agent's start-up gate (Options.StartGated until MarkSynced or the sync timeout).
package agent
