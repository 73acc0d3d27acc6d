package control

import (
	"fmt"
	"net/http"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// missingFeatures returns the features named in the request's protocol.RequiresHeader that
// this agent lacks, at most protocol.MaxMissingFeatures of them.
func missingFeatures(h http.Header) []string {
	var missing []string
	for _, v := range h.Values(protocol.RequiresHeader) {
		for f := range strings.SplitSeq(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" || protocol.HasFeature(f) || len(missing) == protocol.MaxMissingFeatures {
				continue
			}
			if !slices.Contains(missing, f) {
				missing = append(missing, f)
			}
		}
	}
	return missing
}

// refuseTooOld answers a request that requires features this agent lacks: it changes nothing,
// and the controller reports the pod's agent as too old instead of applying half a request.
func refuseTooOld(w http.ResponseWriter, missing []string) {
	refuseWith(w, http.StatusUnprocessableEntity, protocol.Error{
		Reason: protocol.ReasonAgentTooOld,
		Message: fmt.Sprintf("the request requires %s, which this agent (protocol %d) lacks: upgrade it",
			strings.Join(missing, ", "), protocol.Version),
		MissingFeatures: missing,
	})
}

// linkedVersion is the release subflow's own binaries were built for, set at link time by the
// image build (hack/images: -X ...agent/control.linkedVersion=<tag>): a main module's build
// info has no version, only a VCS revision when built in a checkout.
var linkedVersion string

// agentVersion is the version of the subflow module this binary was built with: the
// application's dependency, or the main module for subflow's own binaries (the sidecar), whose
// release the image build links in.
var agentVersion = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return moduleVersion(info, strings.TrimSuffix(reflect.TypeFor[protocol.FlowRequest]().PkgPath(), "/agent/protocol"))
})

// moduleVersion finds module path in info: its version, the replacement's when it is
// replaced by another version, and the VCS revision for a main module built from a checkout.
func moduleVersion(info *debug.BuildInfo, path string) string {
	if info.Main.Path == path {
		if linkedVersion != "" {
			return linkedVersion
		}
		if info.Main.Version != "" && info.Main.Version != "(devel)" {
			return info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return "(devel) " + s.Value
			}
		}
		return info.Main.Version
	}
	for _, m := range info.Deps {
		if m.Path != path {
			continue
		}
		if m.Replace != nil && m.Replace.Version != "" {
			return m.Replace.Version
		}
		return m.Version
	}
	return ""
}
