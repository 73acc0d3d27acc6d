// Command images builds subflow's container images without a Docker daemon: each is one layer,
// run as user 65532, written as an archive that `ctr images import` (or `docker load`) reads.
// The release and the end-to-end suite use this one build path (make images).
//
//	go run ./hack/images -registry subflow.local -tag 0.1.0 -arch amd64 -out dist/images [component...]
//
// Components: controller, sidecar, example-consumer, each a static Go binary; without
// components it builds these three. For the end-to-end cluster only, and only when named: pause
// (the pod sandbox image), gopeer, java-peer and python-peer (the consumer applications of
// hack/clients, which the Java and Python ones run on a runtime assembled from this machine:
// see peers.go).
package main

import (
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

// A component is one image: its name and how to assemble its file system.
type component struct {
	image string
	// root assembles the file system for arch; scratch is a directory for files it makes,
	// removed after the build.
	root func(ctx context.Context, arch, scratch string) (rootFS, error)
}

// rootFS is an image's file system and how it runs.
type rootFS struct {
	files map[string]string // path in the image -> file or directory on this machine (see newTree)
	skip  func(src string) bool
	// entrypoint is the command; pod args follow it (the images have no Cmd).
	entrypoint []string
	env        []string
	// loads are native libraries the runtime loads from inside other files (a jar's), extracted
	// on this machine: the image needs the shared libraries they load.
	loads []string
}

// components names every image this project builds; the Makefile, kustomize and the chart use
// the same names.
var components = map[string]component{
	"controller":       goBinary(".", "subflow-controller"),
	"sidecar":          goBinary("./cmd/subflow-sidecar", "subflow-sidecar"),
	"example-consumer": goBinary("./examples/consumer", "subflow-example-consumer"),
	"pause":            goBinary("./hack/e2e/pause", "subflow-e2e-pause"),
	"gopeer":           goBinary("./hack/clients/gopeer", "subflow-e2e-gopeer"),
	"java-peer":        {image: "subflow-e2e-java-peer", root: javaPeer},
	"python-peer":      {image: "subflow-e2e-python-peer", root: pythonPeer},
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
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "images: %s -> %s (%s, %.1f MB, %.1fs)\n",
			ref.String(), path, arch, float64(info.Size())/1e6, time.Since(start).Seconds())
	}
	return nil
}

// imageRef parses the image's full name. A bare name stays bare in the archive, so the runtime
// that imports it applies its own default registry, as it does for the pods that name it (strict
// validation, which refuses a name without a registry, is for names with one).
func imageRef(registry, image, tag string) (name.Tag, error) {
	full := image + ":" + tag
	if registry == "" {
		return name.NewTag(full)
	}
	return name.NewTag(registry+"/"+full, name.StrictValidation)
}

func buildArchive(ctx context.Context, c component, arch string, ref name.Tag, path string) error {
	scratch, err := os.MkdirTemp("", "subflow-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	root, err := c.root(ctx, arch, scratch)
	if err != nil {
		return err
	}
	img, err := image(ctx, root, arch, filepath.Join(scratch, "layer.tar"))
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// image is one layer, written to layerFile, with the config that runs it.
func image(ctx context.Context, root rootFS, arch, layerFile string) (v1.Image, error) {
	t, err := newTree(root.files, root.skip)
	if err != nil {
		return nil, err
	}
	if err := t.addSharedLibs(ctx, root.loads); err != nil {
		return nil, err
	}
	if err := writeFile(layerFile, t.write); err != nil {
		return nil, err
	}
	// Cached: the archive's manifest needs the compressed digest before the archive takes
	// the compressed bytes, and compressing twice is most of a large image's build.
	layer, err := tarball.LayerFromFile(layerFile, tarball.WithCompressedCaching)
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
	cfg.Config.Entrypoint = root.entrypoint
	cfg.Config.Env = root.env
	cfg.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cfg)
}

func writeFile(path string, write func(w io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// goBinary is the component whose image holds the static binary of the Go package pkg, at
// /<image> and run as the entrypoint.
func goBinary(pkg, image string) component {
	return component{image: image, root: func(ctx context.Context, arch, scratch string) (rootFS, error) {
		bin := filepath.Join(scratch, "bin")
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return rootFS{}, fmt.Errorf("go build %s: %w", pkg, err)
		}
		return rootFS{files: map[string]string{"/" + image: bin}, entrypoint: []string{"/" + image}}, nil
	}}
}
