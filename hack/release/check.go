package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// check reads the release in dir back and returns every way it is wrong: the checksums, each
// image's index, config and binaries, the chart, the plugin archives and the krew manifest.
func check(ctx context.Context, dir, version string) error {
	errs := []error{checkSums(dir, artifacts(version))}
	for _, im := range releaseImages {
		errs = append(errs, prefix(imageArchive(im.component), checkImageArchive(filepath.Join(dir, imageArchive(im.component)), im, version)))
	}
	errs = append(errs, prefix(chartArchive(version), checkChart(ctx, filepath.Join(dir, chartArchive(version)), version)))
	host := platform{runtime.GOOS, runtime.GOARCH}
	if !slices.Contains(pluginPlatforms, host) {
		fmt.Fprintf(os.Stderr, "release: no plugin is built for %s/%s: none is run\n", host.os, host.arch)
	}
	for _, p := range pluginPlatforms {
		errs = append(errs, prefix(pluginArchive(p), checkPluginArchive(ctx, filepath.Join(dir, pluginArchive(p)), p, version, p == host)))
	}
	errs = append(errs, prefix(krewManifest, checkKrew(dir, version)))
	return errors.Join(errs...)
}

func prefix(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// checkSums checks that SHA256SUMS lists exactly the release's other files, each with its digest.
func checkSums(dir string, names []string) error {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || !sha256Hex.MatchString(sum) {
			errs = append(errs, fmt.Errorf("%s: line %q: want <sha256>  <file>", sumsFile, sc.Text()))
			continue
		}
		listed[name] = true
		got, err := fileSHA256(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
		} else if got != sum {
			errs = append(errs, fmt.Errorf("%s: %s lists %s, the file has %s", name, sumsFile, sum, got))
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() != sumsFile && !listed[e.Name()] {
			errs = append(errs, fmt.Errorf("%s is not in %s", e.Name(), sumsFile))
		}
	}
	for _, n := range names {
		if n != sumsFile && !listed[n] {
			errs = append(errs, fmt.Errorf("%s is missing from %s", n, sumsFile))
		}
	}
	return errors.Join(errs...)
}

// checkImageArchive reads an OCI layout archive: index.json must name one image index, tagged
// version, that checkIndex accepts.
func checkImageArchive(archive string, im releaseImage, version string) error {
	dir, err := os.MkdirTemp("", "subflow-release-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(archive, dir); err != nil {
		return err
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return fmt.Errorf("index.json names %d manifests: want one image index", len(m.Manifests))
	}
	d := m.Manifests[0]
	if tag := d.Annotations["org.opencontainers.image.ref.name"]; tag != version {
		return fmt.Errorf("the index is tagged %q: want %q", tag, version)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		return err
	}
	return checkIndex(idx, im, version)
}

// checkIndex checks that idx has one image per release architecture, each with the platform
// its descriptor says (checkImage).
func checkIndex(idx v1.ImageIndex, im releaseImage, version string) error {
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var errs []error
	var archs []string
	for _, d := range m.Manifests {
		if d.Platform == nil || d.Platform.OS != "linux" {
			errs = append(errs, fmt.Errorf("manifest %s: platform %v: want linux", d.Digest, d.Platform))
			continue
		}
		archs = append(archs, d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		errs = append(errs, prefix("linux/"+d.Platform.Architecture, checkImage(img, d.Platform.Architecture, im, version)))
	}
	slices.Sort(archs)
	if !slices.Equal(archs, imageArchs) {
		errs = append(errs, fmt.Errorf("the index has images for %v: want %v", archs, imageArchs))
	}
	return errors.Join(errs...)
}

// checkImage checks what a kubelet reads of an image for arch - its config's os, architecture,
// numeric non-root user and entrypoint - and that the entrypoint's binary in the layers is an
// ELF file for arch, and the labels.
func checkImage(img v1.Image, arch string, im releaseImage, version string) error {
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.OS != "linux" || cfg.Architecture != arch {
		fail("config says %s/%s: want linux/%s", cfg.OS, cfg.Architecture, arch)
	}
	if err := checkUser(cfg.Config.User); err != nil {
		errs = append(errs, err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{im.entrypoint}) {
		fail("entrypoint %q: want [%q]", cfg.Config.Entrypoint, im.entrypoint)
	}
	labels := cfg.Config.Labels
	if labels[labelVersion] != version {
		fail("label %s %q: want %q", labelVersion, labels[labelVersion], version)
	}
	for _, k := range []string{labelSource, labelRevision} {
		if labels[k] == "" {
			fail("label %s is missing", k)
		}
	}
	bin, err := fileBytes(img, im.entrypoint)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	// The image build links the release in (hack/images: the agent's linkedVersion), which the
	// sidecar's agent reports to the controller as its version.
	if im.agent && !bytes.Contains(bin, []byte(version)) {
		fail("%s does not hold its release %q: it would report another version", im.entrypoint, version)
	}
	got, err := binaryPlatform(bin[:min(len(bin), headerSize)])
	if err != nil {
		fail("%s: %w", im.entrypoint, err)
	} else if got != (platform{"linux", arch}) {
		fail("%s is a binary for %s/%s in the image for linux/%s", im.entrypoint, got.os, got.arch, arch)
	}
	return errors.Join(errs...)
}

// checkUser accepts a numeric uid other than 0, with an optional numeric gid: a kubelet can
// verify runAsNonRoot only for a numeric user.
func checkUser(user string) error {
	uid, gid, hasGID := strings.Cut(user, ":")
	n, err := strconv.ParseUint(uid, 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("user %q: want a numeric non-root uid", user)
	}
	if _, err := strconv.ParseUint(gid, 10, 32); hasGID && err != nil {
		return fmt.Errorf("user %q: want a numeric gid", user)
	}
	return nil
}

// fileBytes returns the regular file at file in img's layers (the top layer
// that has it).
func fileBytes(img v1.Image, file string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	want := strings.TrimPrefix(file, "/")
	var head []byte
	found := false
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		h, ok, err := tarFile(rc, want)
		rc.Close()
		if err != nil {
			return nil, err
		}
		if ok {
			head, found = h, true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s is not in the image's layers", file)
	}
	return head, nil
}

// maxBinary bounds what is read of an image's binary.
const maxBinary = 256 << 20

// tarFile reads the regular, executable file name in a tar.
func tarFile(r io.Reader, name string) ([]byte, bool, error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if path.Clean(hdr.Name) != name {
			continue
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Mode&0o111 != 0o111 {
			return nil, false, fmt.Errorf("%s: type %q, mode %o: want a file everyone may execute", name, hdr.Typeflag, hdr.Mode)
		}
		if hdr.Size > maxBinary {
			return nil, false, fmt.Errorf("%s: %d bytes, more than the %d read", name, hdr.Size, maxBinary)
		}
		data := make([]byte, hdr.Size)
		if _, err := io.ReadFull(tr, data); err != nil {
			return nil, false, err
		}
		return data, true, nil
	}
}

// checkPluginArchive checks that the archive holds the plugin, built for p, its completion
// helper and LICENSE. With run (p is this machine's platform), it runs the plugin too: `version
// --client` must print the release's version, the one -X main.version stamped.
func checkPluginArchive(ctx context.Context, archive string, p platform, version string, run bool) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	var names []string
	var errs []error
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		names = append(names, hdr.Name)
		if (hdr.Name == pluginBin || hdr.Name == completionBin) && hdr.Mode&0o111 != 0o111 {
			errs = append(errs, fmt.Errorf("%s has mode %o: want it executable", hdr.Name, hdr.Mode))
		}
		switch hdr.Name {
		case pluginBin:
			errs = append(errs, checkPluginBinary(ctx, tr, hdr.Size, p, version, run))
		case completionBin:
			script, err := io.ReadAll(io.LimitReader(tr, 4096))
			if err != nil {
				return err
			}
			if !strings.HasPrefix(string(script), "#!") || !strings.Contains(string(script), pluginBin+" __complete") {
				errs = append(errs, fmt.Errorf("%s is not a script that runs %s __complete", completionBin, pluginBin))
			}
		}
	}
	slices.Sort(names)
	if want := []string{licenseFile, pluginBin, completionBin}; !slices.Equal(names, want) {
		errs = append(errs, fmt.Errorf("holds %q: want %q", names, want))
	}
	return errors.Join(errs...)
}

// checkPluginBinary checks the plugin binary of size bytes read from r: built for p and, with
// run, stamped with version.
func checkPluginBinary(ctx context.Context, r io.Reader, size int64, p platform, version string, run bool) error {
	head := make([]byte, min(size, headerSize))
	if _, err := io.ReadFull(r, head); err != nil {
		return err
	}
	got, err := binaryPlatform(head)
	if err != nil {
		return fmt.Errorf("%s: %w", pluginBin, err)
	}
	if got != p {
		return fmt.Errorf("%s is built for %s/%s: want %s/%s", pluginBin, got.os, got.arch, p.os, p.arch)
	}
	if !run {
		return nil
	}
	dir, err := os.MkdirTemp("", "subflow-release-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, pluginBin)
	if err := writeEntry(bin, io.MultiReader(bytes.NewReader(head), r)); err != nil {
		return err
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, "version", "--client")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "no-kubeconfig"))
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s version --client: %w", pluginBin, err)
	}
	if want := "Plugin:     " + version + "\n"; string(out) != want {
		return fmt.Errorf("%s version --client prints %q: want %q (built without -X main.version?)", pluginBin, out, want)
	}
	return nil
}

// checkChart lints the packaged chart, reads its Chart.yaml and renders it with the default
// values: the controller's image and the sidecar's must be the release's.
func checkChart(ctx context.Context, archive, version string) error {
	if out, err := exec.CommandContext(ctx, "go", "tool", "helm", "lint", archive).CombinedOutput(); err != nil {
		return fmt.Errorf("helm lint: %w\n%s", err, out)
	}
	data, err := chartFile(archive, "subflow/Chart.yaml")
	if err != nil {
		return err
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		return err
	}
	if chart.Version != version || chart.AppVersion != version {
		return fmt.Errorf("version %q, appVersion %q: want %q for both", chart.Version, chart.AppVersion, version)
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "helm", "template", "subflow", archive).Output()
	if err != nil {
		return fmt.Errorf("helm template: %w", err)
	}
	for _, want := range []string{`image: "subflow-controller:` + version + `"`, "--sidecar-image=subflow-sidecar:" + version} {
		if !strings.Contains(string(out), want) {
			return fmt.Errorf("rendered with its defaults, the chart has no %s", want)
		}
	}
	return nil
}

// chartFile reads one file of a packaged chart.
func chartFile(archive, name string) ([]byte, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s is not in the chart", name)
		}
		if err != nil {
			return nil, err
		}
		if hdr.Name == name {
			return io.ReadAll(io.LimitReader(tr, 1<<20))
		}
	}
}

// untar extracts the regular files and directories of a tar into dir, refusing paths that
// leave it.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(hdr.Name) {
			return fmt.Errorf("%s: entry %q leaves the archive", archive, hdr.Name)
		}
		dst := filepath.Join(dir, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			err = writeEntry(dst, tr)
		default:
			err = fmt.Errorf("%s: entry %q of type %q: want files and directories", archive, hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

func writeEntry(dst string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
