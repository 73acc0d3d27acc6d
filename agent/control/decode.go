package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// maxJSONDepth bounds nesting: a flow request is three levels deep.
const maxJSONDepth = 8

// decodeFlowRequest reads one FlowRequest strictly: unknown fields (also a known name in
// another case, which encoding/json would accept), repeated fields, trailing data and
// inconsistent values are errors that name the problem.
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
	if err := checkFields(json.NewDecoder(bytes.NewReader(data)), reflect.TypeFor[protocol.FlowRequest](), "", 0); err != nil {
		return req, fmt.Errorf("invalid JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return req, errors.New("invalid JSON: more than one object in the body")
	}
	return req, validate(req)
}

// checkFields reads one JSON value and refuses object keys that are not exactly the json
// name of a field of t (nil t: any key), and keys given twice. Types are left to the decoder.
func checkFields(dec *json.Decoder, t reflect.Type, at string, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%s: nested too deeply", at)
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		fields := jsonFields(t)
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			field, ok := fields[key]
			switch {
			case fields != nil && !ok:
				return unknownField(fields, at+key)
			case seen[key]:
				return fmt.Errorf("field %q given twice", at+key)
			}
			seen[key] = true
			if err := checkFields(dec, field, at+key+".", depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && t.Kind() == reflect.Slice {
			elem = t.Elem()
		}
		for dec.More() {
			if err := checkFields(dec, elem, at, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return nil
}

// jsonFields maps the json names of a struct's fields to their types; nil for other types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func unknownField(fields map[string]reflect.Type, key string) error {
	last := key[strings.LastIndex(key, ".")+1:]
	for name := range fields {
		if strings.EqualFold(name, last) {
			return fmt.Errorf("unknown field %q (field names are case-sensitive: %q)", key, name)
		}
	}
	return fmt.Errorf("unknown field %q", key)
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
