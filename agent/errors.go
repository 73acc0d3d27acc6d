package agent

import (
	"errors"
	"fmt"

	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	"github.com/subflow-dev/subflow/agent/protocol"
)

var (
	// ErrMessageChannelOwned is returned by Subscribe when the options carry a MessageChannel:
	// the agent must own that channel to gate flow permits.
	ErrMessageChannelOwned = errors.New("agent: ConsumerOptions.MessageChannel must be nil: the agent owns the consumer's message channel (an application channel would buffer messages past the gate)")
	// ErrConsumerClosed is returned by calls on a consumer the application closed.
	ErrConsumerClosed = errors.New("agent: consumer closed")
	// ErrConsumerStopped is returned by calls that need the broker connection while the
	// consumer is Stopped.
	ErrConsumerStopped = errors.New("agent: consumer is stopped")
	// ErrSeekUnsupported is returned by SeekByIndex on multi-topic and regex consumers.
	ErrSeekUnsupported = errors.New("agent: seek by index needs a consumer of exactly one topic")
	// ErrSeekPartial means a seek of a partitioned topic moved some partitions' cursors and
	// not others; its SeekResult tells which.
	ErrSeekPartial = pulsaradmin.ErrSeekPartial
	// ErrNoAdminURL is returned by SeekByIndex when the agent has no admin URL.
	ErrNoAdminURL = pulsaradmin.ErrNoAdminURL
	// ErrNegativeChunkExpiry is returned by Subscribe for a negative
	// ExpireTimeOfIncompleteChunk: pulsar-client-go would discard and acknowledge every chunked
	// message before its last chunk arrived.
	ErrNegativeChunkExpiry = errors.New("agent: ConsumerOptions.ExpireTimeOfIncompleteChunk is negative: pulsar-client-go would acknowledge every incomplete chunked message at once")
	// ErrIndexMetadataDisabled means the broker attaches no index to entries, so no index can be
	// resolved; nothing was moved.
	ErrIndexMetadataDisabled = pulsaradmin.ErrIndexMetadataDisabled
)

// StaleGenerationError refuses a controller's state change older than the one applied (the
// control server's SetState, the agent's and the sidecar's); applications do not see it.
type StaleGenerationError struct {
	Requested, Applied int64
	State              protocol.State
}

func (e *StaleGenerationError) Error() string {
	return fmt.Sprintf("agent: stale generation %d for state %s: generation %d already applied", e.Requested, e.State, e.Applied)
}
