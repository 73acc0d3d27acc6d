package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeComponent's image holds one file naming the architecture it was built for.
var fakeComponent = component{image: "subflow-fake", root: func(_ context.Context, arch, scratch string) (rootFS, error) {
	bin := filepath.Join(scratch, "bin")
	if err := os.WriteFile(bin, []byte("built for "+arch), 0o755); err != nil {
		return rootFS{}, err
	}
	return rootFS{files: map[string]string{"/subflow-fake": bin}, entrypoint: []string{"/subflow-fake"}}, nil
}}

// untarTo extracts an archive of files and directories into a new directory.
func untarTo(t *testing.T, archive string) string {
	t.Helper()
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, hdr.Name)
		if hdr.Typeflag == tar.TypeDir {
			err = os.MkdirAll(dst, 0o755)
		} else {
			body, _ := io.ReadAll(tr)
			err = os.WriteFile(dst, body, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// -format oci: one layout per component, its index.json naming one multi-architecture index
// tagged as asked, each image with OCI media types, its platform, the labels and its own files.
func TestOCIArchive(t *testing.T) {
	ref, err := name.NewTag("subflow-fake:1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	o := options{tag: "1.2.3", out: out, archs: []string{"amd64", "arm64"}, oci: true,
		labels: map[string]string{"org.opencontainers.image.version": "1.2.3"}}
	if err := writeOCI(context.Background(), fakeComponent, "fake", ref, o); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(out, "fake.oci.tar")
	top, err := layout.ImageIndexFromPath(untarTo(t, archive))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json: %+v; want one OCI image index", tm.Manifests)
	}
	d := tm.Manifests[0]
	if d.Annotations[annotationRefName] != "1.2.3" || d.Annotations[annotationContainerName] != "subflow-fake:1.2.3" {
		t.Errorf("the index's annotations: %v", d.Annotations)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("the index's own annotations: %v", m.Annotations)
	}
	var archs []string
	for _, d := range m.Manifests {
		archs = append(archs, d.Platform.Architecture)
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s: media type %s", d.Platform.Architecture, d.MediaType)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkFakeImage(t, img, d.Platform.Architecture)
	}
	if slices.Sort(archs); !slices.Equal(archs, []string{"amd64", "arm64"}) {
		t.Errorf("images for %v", archs)
	}
	// The same files give the same archive.
	first, _ := os.ReadFile(archive)
	if err := writeOCI(context.Background(), fakeComponent, "fake", ref, o); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(archive); !bytes.Equal(first, second) {
		t.Error("a second build of the same files wrote another archive")
	}
}

func checkFakeImage(t *testing.T, img v1.Image, arch string) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != arch || cfg.Config.User != nonRoot ||
		!slices.Equal(cfg.Config.Entrypoint, []string{"/subflow-fake"}) || cfg.Config.Labels["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("%s: config %s/%s, user %q, entrypoint %q, labels %v", arch, cfg.OS, cfg.Architecture, cfg.Config.User, cfg.Config.Entrypoint, cfg.Config.Labels)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s: %d layers, %v", arch, len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("%s: layer media type %s", arch, mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if got := readLayer(t, data)["subflow-fake"].contents; got != "built for "+arch {
		t.Errorf("%s: the image's file says %q", arch, got)
	}
}
