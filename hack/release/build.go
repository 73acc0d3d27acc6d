package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

type buildOptions struct {
	out, version, registry, url string
	source, revision            string // the images' labels
}

const (
	pluginBin = "kubectl-subflow"
	// completionBin is the helper kubectl 1.26 and later run to complete `kubectl subflow`
	// (the kubectl_complete-<plugin> convention); the archives carry it beside the plugin.
	completionBin = "kubectl_complete-subflow"
	pluginSource  = "./cmd/kubectl-subflow"
	krewName      = "subflow" // kubectl subflow
	sumsFile      = "SHA256SUMS"
	chartDir      = "charts/subflow"
	licenseFile   = "LICENSE"
	krewManifest  = krewName + ".yaml"
)

func pluginArchive(p platform) string      { return fmt.Sprintf("%s_%s_%s.tar.gz", pluginBin, p.os, p.arch) }
func chartArchive(version string) string   { return "subflow-" + version + ".tgz" }
func imageArchive(component string) string { return component + ".oci.tar" }

// artifacts are the files a release of version holds, SHA256SUMS last.
func artifacts(version string) []string {
	var names []string
	for _, im := range releaseImages {
		names = append(names, imageArchive(im.component))
	}
	names = append(names, chartArchive(version))
	for _, p := range pluginPlatforms {
		names = append(names, pluginArchive(p))
	}
	return append(names, krewManifest, sumsFile)
}

// build replaces o.out with the release's artifacts. The images and the plugin binaries
// compile at the same time (each go build is parallel already; together they keep both cores
// busy through the links).
func build(ctx context.Context, o buildOptions) error {
	if err := os.RemoveAll(o.out); err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return buildImages(gctx, o) })
	g.Go(func() error { return buildPlugins(gctx, o) })
	g.Go(func() error { return packageChart(gctx, o) })
	if err := g.Wait(); err != nil {
		return err
	}
	if err := writeKrewManifest(o); err != nil {
		return err
	}
	return writeSums(o.out, artifacts(o.version))
}

// buildImages runs hack/images, the one image build path, for every release image.
func buildImages(ctx context.Context, o buildOptions) error {
	args := []string{"run", "./hack/images", "-format", "oci", "-arch", strings.Join(imageArchs, ","),
		"-registry", o.registry, "-tag", o.version, "-out", o.out,
		"-label", labelVersion + "=" + o.version, "-label", labelSource + "=" + o.source,
		"-label", labelRevision + "=" + o.revision}
	for _, im := range releaseImages {
		args = append(args, im.component)
	}
	return runGo(ctx, nil, args...)
}

func packageChart(ctx context.Context, o buildOptions) error {
	return runGo(ctx, nil, "tool", "helm", "package", chartDir, "--version", o.version,
		"--app-version", o.version, "--destination", o.out)
}

// buildPlugins cross-compiles the plugin for each platform, one after another, into its archive.
func buildPlugins(ctx context.Context, o buildOptions) error {
	for _, p := range pluginPlatforms {
		if err := buildPlugin(ctx, o, p); err != nil {
			return err
		}
	}
	return nil
}

// buildPlugin writes p's plugin archive into o.out. The binary is stamped with the release's
// version (-X main.version), which kubectl subflow version prints.
func buildPlugin(ctx context.Context, o buildOptions, p platform) error {
	start := time.Now()
	scratch, err := os.MkdirTemp("", "subflow-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	license, err := os.ReadFile(licenseFile)
	if err != nil {
		return err
	}
	completion, err := os.ReadFile(filepath.Join(pluginSource, completionBin))
	if err != nil {
		return err
	}
	bin := filepath.Join(scratch, pluginBin)
	env := []string{"CGO_ENABLED=0", "GOOS=" + p.os, "GOARCH=" + p.arch}
	if err := runGo(ctx, env, "build", "-trimpath", "-ldflags=-s -w -X main.version="+o.version, "-o", bin, pluginSource); err != nil {
		return err
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	archive := filepath.Join(o.out, pluginArchive(p))
	if err := os.WriteFile(archive, pluginTarGz(exe, completion, license), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "release: %s (%.1fs)\n", archive, time.Since(start).Seconds())
	return nil
}

// pluginTarGz is the plugin's archive: the binary, its completion helper and LICENSE at its top,
// owned by root and dated epoch, so the same binary gives the same archive.
func pluginTarGz(exe, completion, license []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{pluginBin, 0o755, exe}, {completionBin, 0o755, completion}, {licenseFile, 0o644, license}} {
		// Writes to a bytes.Buffer do not fail.
		_ = tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg})
		_, _ = tw.Write(f.data)
	}
	_ = tw.Close()
	_ = zw.Close()
	return buf.Bytes()
}

func runGo(ctx context.Context, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// revision is the commit the release is built from, "-dirty" when the work tree has changes.
func revision(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		rev += "-dirty"
	}
	return rev
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeSums writes SHA256SUMS for names (but itself), in sha256sum's format.
func writeSums(dir string, names []string) error {
	var b strings.Builder
	for _, n := range slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == sumsFile }) {
		sum, err := fileSHA256(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return os.WriteFile(filepath.Join(dir, sumsFile), []byte(b.String()), 0o644)
}
