package control

import (
	"runtime/debug"
	"testing"
)

// The agent reports the subflow module's version: the application's dependency (a
// replacement's version when replaced by one), or the main module's, with the VCS revision
// when built from a checkout.
func TestModuleVersion(t *testing.T) {
	const path = "github.com/subflow-dev/subflow"
	dep := func(version string, replace *debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v1.0.0"},
			Deps: []*debug.Module{{Path: "example.com/other", Version: "v9.9.9"}, {Path: path, Version: version, Replace: replace}}}
	}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"a dependency", dep("v0.9.0", nil), "v0.9.0"},
		{"replaced by a version", dep("v0.9.0", &debug.Module{Path: "example.com/fork", Version: "v0.9.1-fork"}), "v0.9.1-fork"},
		{"replaced by a directory", dep("v0.9.0", &debug.Module{Path: "../subflow"}), "v0.9.0"},
		{"not linked", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, ""},
		{"the main module, tagged", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "v0.9.0"}}, "v0.9.0"},
		{"the main module from a checkout", &debug.BuildInfo{Main: debug.Module{Path: path, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fcc7152"}}}, "(devel) fcc7152"},
	} {
		if got := moduleVersion(tc.info, path); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	// An image build links the release in: it wins over what a main module's build info says.
	linkedVersion = "0.3.0"
	defer func() { linkedVersion = "" }()
	if got := moduleVersion(&debug.BuildInfo{Main: debug.Module{Path: path, Version: "(devel)"}}, path); got != "0.3.0" {
		t.Errorf("the main module with a linked release: %q, want 0.3.0", got)
	}
	if got := moduleVersion(dep("v0.9.0", nil), path); got != "v0.9.0" {
		t.Errorf("an application's dependency with a linked release: %q, want v0.9.0 (the release linked is subflow's own binaries')", got)
	}
	if agentVersion() == "" {
		t.Error("no agent version in a test binary of the module")
	}
}
