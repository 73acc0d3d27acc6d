package protocol_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Every optional field of FlowRequest is a feature a controller may require, and every
// feature is one: a field added to the request must come with its feature name, so that a
// controller can keep an agent that does not know it from ignoring it.
func TestEveryOptionalRequestFieldIsAFeature(t *testing.T) {
	var optional []string
	optionalPaths(reflect.TypeFor[protocol.FlowRequest](), "", &optional)
	slices.Sort(optional)
	features := protocol.Features()
	slices.Sort(features)
	if !slices.Equal(optional, features) {
		t.Fatalf("optional request fields %q, features %q: name each optional field (JSON path, [] for list elements) in protocol.features", optional, features)
	}
	for _, f := range features {
		if !protocol.HasFeature(f) {
			t.Errorf("HasFeature(%q) is false", f)
		}
	}
	if protocol.HasFeature("seek.timestamp") || protocol.HasFeature("") || protocol.HasFeature("Topic") {
		t.Error("HasFeature accepts a feature this build lacks")
	}
}

func optionalPaths(t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if strings.Contains(opts, "omitempty") {
			*out = append(*out, path)
		}
		optionalPaths(f.Type, path, out)
	}
}
