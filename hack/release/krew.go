package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// krew's plugin manifest (krew's pkg/index types; its docs' "Writing Krew plugin manifests"):
// apiVersion and kind are the only ones krew accepts.
const (
	krewAPIVersion = "krew.googlecontainertools.github.com/v1alpha2"
	krewKind       = "Plugin"
)

type krewPlugin struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   krewMetadata `json:"metadata"`
	Spec       krewSpec     `json:"spec"`
}

type krewMetadata struct {
	Name string `json:"name"`
}

type krewSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage,omitempty"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description,omitempty"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector krewSelector `json:"selector"`
	URI      string       `json:"uri"`
	Sha256   string       `json:"sha256"`
	Files    []krewFile   `json:"files"`
	Bin      string       `json:"bin"`
}

type krewSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// writeKrewManifest writes subflow.yaml for the plugin archives already in o.out.
func writeKrewManifest(o buildOptions) error {
	m := krewPlugin{APIVersion: krewAPIVersion, Kind: krewKind, Metadata: krewMetadata{Name: krewName},
		Spec: krewSpec{
			Version:          "v" + o.version,
			Homepage:         o.source,
			ShortDescription: "Pause, resume, stop and seek Pulsar subscriptions",
			Description: "Drives subflow's SubscriptionFlows during an incident: list flows, pause or resume\n" +
				"them for a while with a reason, wait until every consumer reports the state, seek\n" +
				"a paused subscription, and show each pod's state.\n",
		}}
	for _, p := range pluginPlatforms {
		name := pluginArchive(p)
		sum, err := fileSHA256(filepath.Join(o.out, name))
		if err != nil {
			return err
		}
		uri := name
		if o.url != "" {
			uri = strings.TrimSuffix(o.url, "/") + "/" + name
		}
		m.Spec.Platforms = append(m.Spec.Platforms, krewPlatform{
			Selector: krewSelector{MatchLabels: map[string]string{"os": p.os, "arch": p.arch}},
			URI:      uri, Sha256: sum, Bin: pluginBin,
			Files: []krewFile{{From: pluginBin, To: "."}, {From: completionBin, To: "."}, {From: licenseFile, To: "."}},
		})
	}
	data, err := yaml.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, krewManifest), data, 0o644)
}

var sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)

// checkKrew checks subflow.yaml as krew validates a manifest (its pkg/index/validation), and
// beyond: one platform per plugin archive, each naming that archive with its digest.
func checkKrew(dir, version string) error {
	data, err := os.ReadFile(filepath.Join(dir, krewManifest))
	if err != nil {
		return err
	}
	var m krewPlugin
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return fmt.Errorf("%s: %w", krewManifest, err)
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if m.APIVersion != krewAPIVersion || m.Kind != krewKind {
		fail("apiVersion %q, kind %q: krew reads only %s %s", m.APIVersion, m.Kind, krewAPIVersion, krewKind)
	}
	if m.Metadata.Name != krewName {
		fail("metadata.name %q: want %q, the manifest's file name", m.Metadata.Name, krewName)
	}
	if m.Spec.Version != "v"+version {
		fail("spec.version %q: want v%s", m.Spec.Version, version)
	}
	if m.Spec.ShortDescription == "" {
		fail("spec.shortDescription is empty")
	}
	seen := map[platform]bool{}
	for i, pl := range m.Spec.Platforms {
		p := platform{pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]}
		if len(pl.Selector.MatchLabels) != 2 || seen[p] {
			fail("platforms[%d]: selector %v: want os and arch, once each", i, pl.Selector.MatchLabels)
			continue
		}
		seen[p] = true
		if err := checkKrewPlatform(dir, p, pl); err != nil {
			errs = append(errs, fmt.Errorf("platforms[%d] (%s/%s): %w", i, p.os, p.arch, err))
		}
	}
	for _, p := range pluginPlatforms {
		if !seen[p] {
			fail("no platform for %s/%s", p.os, p.arch)
		}
	}
	if len(m.Spec.Platforms) != len(pluginPlatforms) {
		fail("%d platforms: want %d", len(m.Spec.Platforms), len(pluginPlatforms))
	}
	return errors.Join(errs...)
}

func checkKrewPlatform(dir string, p platform, pl krewPlatform) error {
	name := pluginArchive(p)
	if path.Base(pl.URI) != name {
		return fmt.Errorf("uri %q: want one ending in %s", pl.URI, name)
	}
	if pl.Bin != pluginBin {
		return fmt.Errorf("bin %q: want %s", pl.Bin, pluginBin)
	}
	if !sha256Hex.MatchString(pl.Sha256) {
		return fmt.Errorf("sha256 %q: want 64 lower-case hex digits", pl.Sha256)
	}
	sum, err := fileSHA256(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if pl.Sha256 != sum {
		return fmt.Errorf("sha256 %s, but %s has %s", pl.Sha256, name, sum)
	}
	froms := map[string]bool{}
	for _, f := range pl.Files {
		froms[f.From] = true
	}
	if !froms[pluginBin] || !froms[completionBin] || !froms[licenseFile] {
		return fmt.Errorf("files %v: want %s, %s and %s copied", pl.Files, pluginBin, completionBin, licenseFile)
	}
	return nil
}
