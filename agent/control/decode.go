package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	sigsjson "sigs.k8s.io/json"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// decodeFlowRequest reads one FlowRequest strictly: unknown fields (also a known name in
// another case, which encoding/json would accept), repeated fields, trailing data and
// inconsistent values are errors that name the problem. sigs.k8s.io/json decodes as the
// Kubernetes API server does, case-sensitively, and names each strict problem with its path.
func decodeFlowRequest(body io.Reader) (protocol.FlowRequest, error) {
	var req protocol.FlowRequest
	data, err := io.ReadAll(body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return req, fmt.Errorf("request body larger than %d bytes", tooLarge.Limit)
		}
		return req, fmt.Errorf("reading the body: %w", err)
	}
	if err := oneValue(data); err != nil {
		return req, fmt.Errorf("invalid JSON: %w", err)
	}
	strict, err := sigsjson.UnmarshalStrict(data, &req, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return req, fmt.Errorf("invalid JSON: %w", err)
	}
	if len(strict) > 0 {
		return req, fmt.Errorf("invalid JSON: %w", errors.Join(strict...))
	}
	return req, validate(req)
}

// oneValue refuses a body with anything after its first JSON value.
func oneValue(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one object in the body")
	}
	return nil
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
	return validateMoved(seek, seen)
}

// validateMoved checks a partial seek's notice: it names partitions of the seek, each once.
func validateMoved(seek *protocol.SeekRequest, targets map[int32]bool) error {
	if len(seek.MovedPartitions) > 0 && seek.Succeeded {
		return errors.New("seek.movedPartitions is for a seek that did not succeed: not with seek.succeeded")
	}
	if seek.Index != nil {
		targets = map[int32]bool{-1: true}
	}
	named := map[int32]bool{}
	for _, p := range seek.MovedPartitions {
		if !targets[p] || named[p] {
			return fmt.Errorf("seek.movedPartitions: partition %d is not a target of the seek, or appears twice", p)
		}
		named[p] = true
	}
	if len(seek.Positions) > 0 && !seek.Succeeded && len(seek.MovedPartitions) == 0 {
		return errors.New("seek.positions tells where a finished seek moved the cursors: only with seek.succeeded or seek.movedPartitions")
	}
	for _, p := range seek.Positions {
		if !targets[p.Partition] {
			return fmt.Errorf("seek.positions: partition %d is not a target of the seek", p.Partition)
		}
		if p.MessageID != "" && !numbers(p.MessageID, 4) {
			return fmt.Errorf("seek.positions: message id %q: want ledger:entry:partition:batch", p.MessageID)
		}
		if p.Cursor != "" && !numbers(p.Cursor, 2) {
			return fmt.Errorf("seek.positions: cursor %q: want ledger:entry", p.Cursor)
		}
	}
	return nil
}

// numbers reports whether s is n integers separated by colons.
func numbers(s string, n int) bool {
	parts := strings.Split(s, ":")
	if len(parts) != n {
		return false
	}
	for _, p := range parts {
		if _, err := strconv.ParseInt(p, 10, 64); err != nil {
			return false
		}
	}
	return true
}
