package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	sigsjson "sigs.k8s.io/json"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// decodeFlowRequest reads one FlowRequest. Fields it does not know are ignored and returned
// (a newer controller's optional fields; see protocol.RequiresHeader for the others); a
// repeated field, a known field's name in another case (which encoding/json would take for
// it), trailing data and inconsistent values are errors that name the problem. The values are
// decoded with sigs.k8s.io/json, case-sensitively, as the Kubernetes API server does.
func decodeFlowRequest(body io.Reader) (protocol.FlowRequest, []string, error) {
	var req protocol.FlowRequest
	data, err := io.ReadAll(body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return req, nil, fmt.Errorf("request body larger than %d bytes", tooLarge.Limit)
		}
		return req, nil, fmt.Errorf("reading the body: %w", err)
	}
	ignored, err := checkFields(data, reflect.TypeFor[protocol.FlowRequest]())
	if err != nil {
		return req, nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &req); err != nil {
		return req, nil, fmt.Errorf("invalid JSON: %w", err)
	}
	return req, ignored, validate(req)
}

// fieldWalk walks a JSON value along the Go type it decodes into, checking the keys of every
// object the type knows. Only known fields are descended into, so the walk is as deep as the
// type; an unknown field's value is skipped whole.
type fieldWalk struct {
	dec     *json.Decoder
	ignored []string // distinct paths, at most protocol.MaxIgnoredFields
}

// checkFields returns the paths of the fields of data that t does not know, and an error for a
// repeated key, a known name in another case, or anything after the first value.
func checkFields(data []byte, t reflect.Type) ([]string, error) {
	w := &fieldWalk{dec: json.NewDecoder(bytes.NewReader(data))}
	if err := w.value(t, ""); err != nil {
		return nil, err
	}
	if w.dec.More() {
		return nil, errors.New("more than one object in the body")
	}
	return w.ignored, nil
}

func (w *fieldWalk) value(t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || (t.Kind() != reflect.Struct && t.Kind() != reflect.Slice) {
		var skip json.RawMessage
		return w.dec.Decode(&skip)
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	switch {
	case tok == json.Delim('{') && t.Kind() == reflect.Struct:
		return w.object(t, path)
	case tok == json.Delim('[') && t.Kind() == reflect.Slice:
		for i := 0; w.dec.More(); i++ {
			if err := w.value(t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = w.dec.Token()
		return err
	case tok == json.Delim('{') || tok == json.Delim('['):
		return w.skipRest() // the typed decode names the mismatch
	}
	return nil
}

func (w *fieldWalk) object(t reflect.Type, path string) error {
	known := jsonFields(t)
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		at := key
		if path != "" {
			at = path + "." + key
		}
		if seen[key] {
			return fmt.Errorf("duplicate field %q", at)
		}
		seen[key] = true
		field, ok := known[key]
		if !ok {
			for name := range known {
				if strings.EqualFold(name, key) {
					return fmt.Errorf("unknown field %q: names are case-sensitive, this one is %q", at, name)
				}
			}
			w.ignore(at)
		}
		if err := w.value(field, at); err != nil {
			return err
		}
	}
	_, err := w.dec.Token()
	return err
}

// skipRest consumes the rest of an object or array whose opening delimiter was read.
func (w *fieldWalk) skipRest() error {
	for depth := 1; depth > 0; {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// listIndex matches the index of a list element in a field path.
var listIndex = regexp.MustCompile(`\[[0-9]+\]`)

// ignore records an unknown field once per path, list elements folded into "[]".
func (w *fieldWalk) ignore(path string) {
	path = listIndex.ReplaceAllString(path, "[]")
	if !slices.Contains(w.ignored, path) && len(w.ignored) < protocol.MaxIgnoredFields {
		w.ignored = append(w.ignored, path)
	}
}

// jsonFields maps the JSON names of a struct's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "-" && f.IsExported() {
			if name == "" {
				name = f.Name
			}
			out[name] = f.Type
		}
	}
	return out
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
	if err := validateBacklogOf(req.BacklogOf); err != nil {
		return err
	}
	return validateSeek(req.Seek)
}

// validateBacklogOf bounds the other subscriptions a rule has this agent watch: each one is a
// background read of the admin API and entries in every answer.
func validateBacklogOf(subscriptions []string) error {
	if len(subscriptions) > protocol.MaxBacklogOf {
		return fmt.Errorf("backlogOf names %d subscriptions: at most %d", len(subscriptions), protocol.MaxBacklogOf)
	}
	for i, s := range subscriptions {
		switch {
		case s == "":
			return fmt.Errorf("backlogOf[%d] is empty: want a subscription name", i)
		case len(s) > protocol.MaxBacklogOfNameBytes:
			return fmt.Errorf("backlogOf[%d] is %d bytes long: at most %d", i, len(s), protocol.MaxBacklogOfNameBytes)
		case strings.ContainsFunc(s, unicode.IsControl):
			return fmt.Errorf("backlogOf[%d] %q holds a control character", i, s)
		case slices.Contains(subscriptions[:i], s):
			return fmt.Errorf("backlogOf[%d] %q appears twice", i, s)
		}
	}
	return nil
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
