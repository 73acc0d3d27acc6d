package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// decodeFlowRequest reads one FlowRequest strictly: unknown fields, trailing data and
// inconsistent values are errors that name the problem.
func decodeFlowRequest(body io.Reader) (protocol.FlowRequest, error) {
	var req protocol.FlowRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return req, fmt.Errorf("request body larger than %d bytes", tooLarge.Limit)
		}
		return req, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return req, errors.New("invalid JSON: more than one object in the body")
	}
	return req, validate(req)
}

func validate(req protocol.FlowRequest) error {
	switch {
	case req.UID == "":
		return errors.New("uid is required")
	case req.Revision < 1:
		return errors.New("revision must be at least 1")
	case req.Subscription == "":
		return errors.New("subscription is required")
	case !req.State.Valid():
		return fmt.Errorf("state %q: want Running, Paused or Stopped", req.State)
	}
	return validateSeek(req.Seek)
}

func validateSeek(seek *protocol.SeekRequest) error {
	if seek == nil {
		return nil
	}
	if seek.ID == "" {
		return errors.New("seek.id is required")
	}
	if (seek.Index == nil) == (len(seek.Partitions) == 0) {
		return errors.New("seek needs exactly one of index or partitions")
	}
	if seek.Index != nil && *seek.Index < 0 {
		return errors.New("seek.index must not be negative")
	}
	seen := map[int32]bool{}
	for _, p := range seek.Partitions {
		if p.Partition < 0 || p.Index < 0 {
			return fmt.Errorf("seek.partitions: partition %d index %d must not be negative", p.Partition, p.Index)
		}
		if seen[p.Partition] {
			return fmt.Errorf("seek.partitions: partition %d appears twice", p.Partition)
		}
		seen[p.Partition] = true
	}
	return nil
}
