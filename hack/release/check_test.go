package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"debug/macho"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

// fakeBinary is the start of an executable for p, as the Go linker writes it.
func fakeBinary(p platform) []byte {
	head := make([]byte, headerSize)
	switch p.os {
	case "linux":
		copy(head, elf.ELFMAG)
		head[elf.EI_CLASS], head[elf.EI_DATA], head[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
		binary.LittleEndian.PutUint16(head[16:], uint16(elf.ET_EXEC))
		m := elf.EM_X86_64
		if p.arch == "arm64" {
			m = elf.EM_AARCH64
		}
		binary.LittleEndian.PutUint16(head[18:], uint16(m))
	case "darwin":
		binary.LittleEndian.PutUint32(head, macho.Magic64)
		c := macho.CpuAmd64
		if p.arch == "arm64" {
			c = macho.CpuArm64
		}
		binary.LittleEndian.PutUint32(head[4:], uint32(c))
	}
	return append(head, "rest of the binary"...)
}

func TestBinaryPlatform(t *testing.T) {
	for _, p := range pluginPlatforms {
		got, err := binaryPlatform(fakeBinary(p))
		if err != nil || got != p {
			t.Errorf("%v: got %v, %v", p, got, err)
		}
	}
	// The test binary itself: a real ELF file from the Go linker.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, headerSize)
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	if got, err := binaryPlatform(head); err != nil || got != (platform{runtime.GOOS, runtime.GOARCH}) {
		t.Errorf("this test's binary: got %v, %v; want %s/%s", got, err, runtime.GOOS, runtime.GOARCH)
	}
	for _, bad := range [][]byte{nil, []byte("#!/bin/sh\necho hi\n"), fakeBinary(platform{"linux", "amd64"})[:10]} {
		if got, err := binaryPlatform(bad); err == nil {
			t.Errorf("%q: got %v, want an error", bad, got)
		}
	}
}

var controller = releaseImages[0]

// fakeImage is an image for arch as hack/images builds one, its entrypoint a binary for binArch;
// edit changes its config.
func fakeImage(t *testing.T, arch, binArch string, edit func(*v1.ConfigFile)) v1.Image {
	t.Helper()
	return fakeImageOf(t, controller, arch, fakeBinary(platform{"linux", binArch}), edit)
}

// fakeImageOf is im's image for arch holding bin.
func fakeImageOf(t *testing.T, im releaseImage, arch string, bin []byte, edit func(*v1.ConfigFile)) v1.Image {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, h := range []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: strings.TrimPrefix(im.entrypoint, "/"), Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromReader(bytes.NewReader(layer.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Config.User = "65532:65532"
	cfg.Config.Entrypoint = []string{im.entrypoint}
	cfg.Config.Labels = map[string]string{labelVersion: "1.2.3", labelSource: "https://example.com/subflow", labelRevision: "abc123"}
	if edit != nil {
		edit(cfg)
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func fakeIndex(imgs map[string]v1.Image) v1.ImageIndex {
	var idx v1.ImageIndex = empty.Index
	for arch, img := range imgs {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return idx
}

// The sidecar's binary holds its release, which its agent reports to the controller: one built
// without it (a main module's build info has no version) fails the check.
func TestCheckIndexSidecarHoldsItsRelease(t *testing.T) {
	sidecar := releaseImages[1]
	image := func(arch string, linked string) v1.Image {
		return fakeImageOf(t, sidecar, arch, append(fakeBinary(platform{"linux", arch}), linked...), nil)
	}
	if err := checkIndex(fakeIndex(map[string]v1.Image{"amd64": image("amd64", "1.2.3"), "arm64": image("arm64", "1.2.3")}), sidecar, "1.2.3"); err != nil {
		t.Errorf("a sidecar holding its release: %v", err)
	}
	err := checkIndex(fakeIndex(map[string]v1.Image{"amd64": image("amd64", "1.2.3"), "arm64": image("arm64", "(devel)")}), sidecar, "1.2.3")
	if err == nil || !strings.Contains(err.Error(), `linux/arm64: /subflow-sidecar does not hold its release "1.2.3"`) {
		t.Errorf("a sidecar without its release: %v, want refused", err)
	}
}

// A wrong image fails the check, saying what is wrong; a right one passes.
func TestCheckIndex(t *testing.T) {
	good := func(arch string) v1.Image { return fakeImage(t, arch, arch, nil) }
	for _, tc := range []struct {
		name string
		imgs map[string]v1.Image
		want string // in the error; empty: no error
	}{
		{"as hack/images builds them", map[string]v1.Image{"amd64": good("amd64"), "arm64": good("arm64")}, ""},
		{"an amd64 binary in the arm64 image",
			map[string]v1.Image{"amd64": good("amd64"), "arm64": fakeImage(t, "arm64", "amd64", nil)},
			"/subflow-controller is a binary for linux/amd64 in the image for linux/arm64"},
		{"the arm64 image's config says amd64",
			map[string]v1.Image{"amd64": good("amd64"), "arm64": fakeImage(t, "amd64", "arm64", nil)},
			"config says linux/amd64: want linux/arm64"},
		{"no arm64 image", map[string]v1.Image{"amd64": good("amd64")}, "the index has images for [amd64]"},
		{"root", map[string]v1.Image{"amd64": good("amd64"), "arm64": fakeImage(t, "arm64", "arm64", func(c *v1.ConfigFile) { c.Config.User = "0:0" })},
			`user "0:0": want a numeric non-root uid`},
		{"no user", map[string]v1.Image{"amd64": fakeImage(t, "amd64", "amd64", func(c *v1.ConfigFile) { c.Config.User = "" }), "arm64": good("arm64")},
			`user "": want a numeric non-root uid`},
		{"a user name", map[string]v1.Image{"amd64": fakeImage(t, "amd64", "amd64", func(c *v1.ConfigFile) { c.Config.User = "nonroot" }), "arm64": good("arm64")},
			`user "nonroot"`},
		{"a shell entrypoint", map[string]v1.Image{"amd64": fakeImage(t, "amd64", "amd64", func(c *v1.ConfigFile) {
			c.Config.Entrypoint = []string{"/bin/sh", "-c", "/subflow-controller"}
		}), "arm64": good("arm64")}, "entrypoint"},
		{"another version", map[string]v1.Image{"amd64": good("amd64"), "arm64": fakeImage(t, "arm64", "arm64", func(c *v1.ConfigFile) { c.Config.Labels[labelVersion] = "1.2.2" })},
			`label org.opencontainers.image.version "1.2.2": want "1.2.3"`},
		{"no revision", map[string]v1.Image{"amd64": good("amd64"), "arm64": fakeImage(t, "arm64", "arm64", func(c *v1.ConfigFile) { delete(c.Config.Labels, labelRevision) })},
			"label org.opencontainers.image.revision is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkIndex(fakeIndex(tc.imgs), controller, "1.2.3")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// completionScript is the completion helper the release ships.
func completionScript(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", pluginSource, completionBin))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writePluginArchive(t *testing.T, dir string, p platform, bin platform, license bool) {
	t.Helper()
	data := pluginTarGz(fakeBinary(bin), completionScript(t), []byte("license"))
	if !license {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: pluginBin, Mode: 0o755, Size: headerSize, Typeflag: tar.TypeReg})
		_, _ = tw.Write(fakeBinary(bin)[:headerSize])
		_ = tw.Close()
		data = gzipBytes(t, buf.Bytes())
	}
	if err := os.WriteFile(filepath.Join(dir, pluginArchive(p)), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckPluginArchive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := platform{"darwin", "arm64"}
	check := func() error { return checkPluginArchive(ctx, filepath.Join(dir, pluginArchive(p)), p, "1.2.3", false) }
	writePluginArchive(t, dir, p, p, true)
	if err := check(); err != nil {
		t.Errorf("as built: %v", err)
	}
	writePluginArchive(t, dir, p, platform{"darwin", "amd64"}, true)
	if err := check(); err == nil || !strings.Contains(err.Error(), "built for darwin/amd64: want darwin/arm64") {
		t.Errorf("an amd64 binary in the arm64 archive: got %v", err)
	}
	writePluginArchive(t, dir, p, platform{"linux", "arm64"}, true)
	if err := check(); err == nil || !strings.Contains(err.Error(), "built for linux/arm64") {
		t.Errorf("a linux binary in the darwin archive: got %v", err)
	}
	writePluginArchive(t, dir, p, p, false)
	if err := check(); err == nil || !strings.Contains(err.Error(), "LICENSE") || !strings.Contains(err.Error(), completionBin) {
		t.Errorf("no LICENSE and no completion helper: got %v", err)
	}
	data := pluginTarGz(fakeBinary(p), []byte("#!/bin/sh\nexit 0\n"), []byte("license"))
	if err := os.WriteFile(filepath.Join(dir, pluginArchive(p)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "is not a script that runs kubectl-subflow __complete") {
		t.Errorf("another completion helper: got %v", err)
	}
}

// The plugin make release builds for this machine prints the release's version, and the check
// that runs it tells another version apart.
func TestCheckPluginArchiveRunsThePlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin")
	}
	host := platform{runtime.GOOS, runtime.GOARCH}
	if !slices.Contains(pluginPlatforms, host) {
		t.Skipf("no plugin is built for %s/%s", host.os, host.arch)
	}
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir("../..")
	if err := buildPlugin(ctx, buildOptions{out: dir, version: "1.2.3-rc.1"}, host); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, pluginArchive(host))
	if err := checkPluginArchive(ctx, archive, host, "1.2.3-rc.1", true); err != nil {
		t.Errorf("as built: %v", err)
	}
	if err := checkPluginArchive(ctx, archive, host, "1.2.3", true); err == nil ||
		!strings.Contains(err.Error(), `version --client prints "Plugin:     1.2.3-rc.1\n": want "Plugin:     1.2.3\n"`) {
		t.Errorf("another version: got %v", err)
	}
}

// fakeRelease writes the plugin archives, the krew manifest and SHA256SUMS as build does
// (the images and the chart are other tests').
func fakeRelease(t *testing.T, url string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range pluginPlatforms {
		writePluginArchive(t, dir, p, p, true)
	}
	if err := writeKrewManifest(buildOptions{out: dir, version: "1.2.3", url: url, source: "https://example.com/subflow"}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pluginPlatforms {
		names = append(names, pluginArchive(p))
	}
	names = append(names, krewManifest)
	if err := writeSums(dir, names); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCheckKrew(t *testing.T) {
	for _, url := range []string{"", "https://example.com/releases/v1.2.3/"} {
		dir := fakeRelease(t, url)
		if err := checkKrew(dir, "1.2.3"); err != nil {
			t.Errorf("url %q: %v", url, err)
		}
		if err := checkKrew(dir, "1.2.4"); err == nil || !strings.Contains(err.Error(), `spec.version "v1.2.3": want v1.2.4`) {
			t.Errorf("another version: got %v", err)
		}
	}
	manifest := func(dir string) string {
		data, err := os.ReadFile(filepath.Join(dir, krewManifest))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	for _, tc := range []struct {
		name string
		edit func(dir, m string) string
		want string
	}{
		{"an archive rebuilt after the manifest", func(dir, m string) string {
			writePluginArchive(t, dir, platform{"linux", "arm64"}, platform{"linux", "amd64"}, true)
			return m
		}, "platforms[1] (linux/arm64): sha256"},
		{"krew's old apiVersion", func(_, m string) string {
			return strings.Replace(m, krewAPIVersion, "krew.googlecontainertools.github.com/v1alpha1", 1)
		}, "krew reads only"},
		{"no darwin/arm64", func(_, m string) string {
			var k krewPlugin
			if err := yaml.Unmarshal([]byte(m), &k); err != nil {
				t.Fatal(err)
			}
			k.Spec.Platforms[3].Selector.MatchLabels["os"] = "windows"
			data, err := yaml.Marshal(k)
			if err != nil {
				t.Fatal(err)
			}
			return string(data)
		}, "no platform for darwin/arm64"},
		{"no completion helper copied", func(_, m string) string {
			var k krewPlugin
			if err := yaml.Unmarshal([]byte(m), &k); err != nil {
				t.Fatal(err)
			}
			k.Spec.Platforms[0].Files = slices.DeleteFunc(k.Spec.Platforms[0].Files, func(f krewFile) bool { return f.From == completionBin })
			data, err := yaml.Marshal(k)
			if err != nil {
				t.Fatal(err)
			}
			return string(data)
		}, "platforms[0] (linux/amd64): files"},
		{"an unknown field", func(_, m string) string {
			return strings.Replace(m, "shortDescription:", "shortDesc: x\n  shortDescription:", 1)
		}, "unknown field"},
		{"another bin", func(_, m string) string {
			return strings.Replace(m, "bin: kubectl-subflow", "bin: subflow", 1)
		}, `bin "subflow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fakeRelease(t, "")
			m := tc.edit(dir, manifest(dir))
			if err := os.WriteFile(filepath.Join(dir, krewManifest), []byte(m), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := checkKrew(dir, "1.2.3"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestCheckSums(t *testing.T) {
	names := func() []string {
		var n []string
		for _, p := range pluginPlatforms {
			n = append(n, pluginArchive(p))
		}
		return append(n, krewManifest, sumsFile)
	}()
	dir := fakeRelease(t, "")
	if err := checkSums(dir, names); err != nil {
		t.Fatalf("as written: %v", err)
	}
	if err := checkSums(dir, append(names, "subflow-1.2.3.tgz")); err == nil || !strings.Contains(err.Error(), "subflow-1.2.3.tgz is missing") {
		t.Errorf("an artifact not listed: got %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "extra.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkSums(dir, names); err == nil || !strings.Contains(err.Error(), "extra.txt is not in SHA256SUMS") {
		t.Errorf("a file not listed: got %v", err)
	}
	os.Remove(filepath.Join(dir, "extra.txt"))
	f, err := os.OpenFile(filepath.Join(dir, krewManifest), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("# changed\n")
	f.Close()
	if err := checkSums(dir, names); err == nil || !strings.Contains(err.Error(), krewManifest+": SHA256SUMS lists") {
		t.Errorf("a changed file: got %v", err)
	}
}

// The chart as make release packages it passes; a chart of another version does not.
func TestCheckChart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs helm")
	}
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir("../..")
	if err := packageChart(ctx, buildOptions{out: dir, version: "1.2.3"}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, chartArchive("1.2.3"))
	if err := checkChart(ctx, archive, "1.2.3"); err != nil {
		t.Errorf("as packaged: %v", err)
	}
	if err := checkChart(ctx, archive, "1.2.4"); err == nil || !strings.Contains(err.Error(), `version "1.2.3", appVersion "1.2.3": want "1.2.4"`) {
		t.Errorf("another version: got %v", err)
	}
}

func gzipBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
