// Command images builds subflow's container images without a Docker daemon: each is one layer
// holding a static Go binary (and an empty /tmp), run as user 65532, written as an archive that
// `ctr images import` (or `docker load`) reads. The release and the end-to-end suite use this one
// build path (make images).
//
//	go run ./hack/images -registry subflow.local -tag 0.1.0 -arch amd64 -out dist/images [component...]
//
// Components: controller, sidecar, example-consumer, and for the end-to-end cluster only, pause
// (the pod sandbox image). Without components it builds the first three.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// component is one image: the Go package whose binary it runs and the image's name.
type component struct {
	pkg   string
	image string
	// args are the image's default arguments (Cmd); pod args replace them.
	args []string
}

// components names every image this project builds; the Makefile, kustomize and the chart use
// the same names.
var components = map[string]component{
	"controller":       {pkg: ".", image: "subflow-controller"},
	"sidecar":          {pkg: "./cmd/subflow-sidecar", image: "subflow-sidecar"},
	"example-consumer": {pkg: "./examples/consumer", image: "subflow-example-consumer"},
	"pause":            {pkg: "./hack/e2e/pause", image: "subflow-e2e-pause"},
}

var defaultComponents = []string{"controller", "sidecar", "example-consumer"}

// nonRoot is the user every image runs as, so charts with runAsNonRoot admit it.
const nonRoot = "65532:65532"

func main() {
	registry := flag.String("registry", "", "registry and path the image names start with (empty: bare names)")
	tag := flag.String("tag", "dev", "the images' tag")
	arch := flag.String("arch", "amd64", "the target architecture (GOARCH)")
	out := flag.String("out", "dist/images", "directory for the archives, one <component>-<arch>.tar each")
	flag.Parse()
	names := flag.Args()
	if len(names) == 0 {
		names = defaultComponents
	}
	if err := run(context.Background(), *registry, *tag, *arch, *out, names); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, registry, tag, arch, out string, names []string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		c, ok := components[n]
		if !ok {
			return fmt.Errorf("unknown component %q", n)
		}
		ref, err := imageRef(registry, c.image, tag)
		if err != nil {
			return err
		}
		path := filepath.Join(out, n+"-"+arch+".tar")
		start := time.Now()
		if err := buildArchive(ctx, c, arch, ref, path); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		fmt.Fprintf(os.Stderr, "images: %s -> %s (%s, %.1fs)\n", ref.Name(), path, arch, time.Since(start).Seconds())
	}
	return nil
}

// imageRef parses the image's full name. A bare name stays bare in the archive, so the runtime
// that imports it applies its own default registry, as it does for the pods that name it.
func imageRef(registry, image, tag string) (name.Tag, error) {
	full := image + ":" + tag
	if registry != "" {
		full = registry + "/" + full
	}
	return name.NewTag(full, name.StrictValidation)
}

func buildArchive(ctx context.Context, c component, arch string, ref name.Tag, path string) error {
	bin, err := goBuild(ctx, c.pkg, arch)
	if err != nil {
		return err
	}
	img, err := image(bin, "/"+filepath.Base(c.image), c.args, arch)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// goBuild builds a static binary for linux/arch and returns its bytes.
func goBuild(ctx context.Context, pkg, arch string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "subflow-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "bin")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s: %w", pkg, err)
	}
	return os.ReadFile(bin)
}

// image is one layer (the binary at path, an empty sticky /tmp) with the config that runs it.
func image(bin []byte, path string, args []string, arch string) (v1.Image, error) {
	layerTar, err := layerFiles(bin, path)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Config.User = nonRoot
	cfg.Config.Entrypoint = []string{path}
	cfg.Config.Cmd = args
	cfg.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cfg)
}

// layerFiles is the layer's tar: fixed times and owners, so the same binary gives the same
// layer digest.
func layerFiles(bin []byte, path string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	entries := []struct {
		hdr  tar.Header
		body []byte
	}{
		{tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}, nil},
		{tar.Header{Typeflag: tar.TypeReg, Name: path[1:], Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}, bin},
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
