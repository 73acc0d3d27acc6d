package control

import (
	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/internal/seam"
)

// Host is the pod's side of subflow that the control server drives: the agent linked into a
// Go application (New, AgentHost), or the protocol sidecar next to an application in any
// language (agent/sidecar). Both report the consumers they gate, and the server applies the
// rules to them in the same way, so the controller cannot tell them apart but by Kind. Its
// methods are documented in agent/internal/seam.
type Host = seam.Host

// Consumer is one gated consumer, with the transitions the control server applies (SetState
// with a generation, DropHeldOf and FilterSeekTargets after a seek another consumer ran).
type Consumer = seam.Consumer

// AgentHost is the Host of an agent linked into the application. The agent keeps these
// control-plane operations out of its own API: only the control server applies them.
func AgentHost(a *agent.Agent) Host { return seam.AgentHost(a) }
