// Command images builds subflow's container images without a Docker daemon: each is one layer,
// run as user 65532, written as an archive that `ctr images import` (or `docker load`) reads.
// The release and the end-to-end suite use this one build path (make images, make release).
//
//	go run ./hack/images -registry subflow.local -tag 0.1.0 -arch amd64 -out dist/images [component...]
//
// Components: controller, sidecar, example-consumer, each a static Go binary; without
// components it builds these three. For the end-to-end cluster only, and only when named: pause
// (the pod sandbox image), gopeer, java-peer and python-peer (the consumer applications of
// hack/clients, which the Java and Python ones run on a runtime assembled from this machine:
// see peers.go).
//
// -format docker (the default) writes one archive per component and architecture,
// <component>-<arch>.tar, as docker save does. -format oci writes one OCI image layout per
// component, <component>.oci.tar, whose index.json names one multi-architecture index with an
// image for each of -arch (a comma-separated list): what the release publishes (oci.go).
// -label key=value (repeatable) adds a label to every image's config.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// A component is one image: its name and how to assemble its file system.
type component struct {
	image string
	// goPkg, when set, is the Go package whose static binary the image holds, at /<image> and
	// run as the entrypoint; root is then unused.
	goPkg string
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
	"controller":       {image: "subflow-controller", goPkg: "."},
	"sidecar":          {image: "subflow-sidecar", goPkg: "./cmd/subflow-sidecar"},
	"example-consumer": {image: "subflow-example-consumer", goPkg: "./examples/consumer"},
	"pause":            {image: "subflow-e2e-pause", goPkg: "./hack/e2e/pause"},
	"gopeer":           {image: "subflow-e2e-gopeer", goPkg: "./hack/clients/gopeer"},
	"java-peer":        {image: "subflow-e2e-java-peer", root: javaPeer},
	"python-peer":      {image: "subflow-e2e-python-peer", root: pythonPeer},
}

var defaultComponents = []string{"controller", "sidecar", "example-consumer"}

// nonRoot is the user every image runs as, so charts with runAsNonRoot admit it.
const nonRoot = "65532:65532"

// options are how every image of one run is built and written.
type options struct {
	registry, tag, out string
	archs              []string
	oci                bool              // one OCI layout per component instead of one docker archive per arch
	labels             map[string]string // added to every image's config
}

func main() {
	registry := flag.String("registry", "", "registry and path the image names start with (empty: bare names)")
	tag := flag.String("tag", "dev", "the images' tag")
	arch := flag.String("arch", "amd64", "the target architectures (GOARCH), comma-separated")
	out := flag.String("out", "dist/images", "directory for the archives")
	format := flag.String("format", "docker", "docker: <component>-<arch>.tar each; oci: <component>.oci.tar, one multi-architecture index each")
	labels := labelFlag{}
	flag.Var(labels, "label", "key=value added to every image's config labels (repeatable)")
	flag.Parse()
	names := flag.Args()
	if len(names) == 0 {
		names = defaultComponents
	}
	if *format != "docker" && *format != "oci" {
		fmt.Fprintf(os.Stderr, "images: -format %q: want docker or oci\n", *format)
		os.Exit(2)
	}
	o := options{registry: *registry, tag: *tag, out: *out, archs: strings.Split(*arch, ","),
		oci: *format == "oci", labels: labels}
	if err := run(context.Background(), o, names); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// labelFlag collects -label key=value.
type labelFlag map[string]string

func (l labelFlag) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labelFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want key=value", s)
	}
	l[k] = v
	return nil
}

func run(ctx context.Context, o options, names []string) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		c, ok := components[n]
		if !ok {
			return fmt.Errorf("unknown component %q", n)
		}
		ref, err := imageRef(o.registry, c.image, o.tag)
		if err != nil {
			return err
		}
		if o.oci {
			err = writeOCI(ctx, c, n, ref, o)
		} else {
			err = writeDocker(ctx, c, n, ref, o)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// writeDocker writes <out>/<n>-<arch>.tar for each architecture.
func writeDocker(ctx context.Context, c component, n string, ref name.Tag, o options) error {
	for _, arch := range o.archs {
		path := filepath.Join(o.out, n+"-"+arch+".tar")
		start := time.Now()
		err := withScratch(func(scratch string) error {
			img, err := build(ctx, c, arch, scratch, o)
			if err != nil {
				return err
			}
			return writeAtomic(path, func(tmp string) error { return tarball.WriteToFile(tmp, ref, img) })
		})
		if err != nil {
			return err
		}
		report(ref.String(), path, arch, start)
	}
	return nil
}

func report(ref, path, arch string, start time.Time) {
	size := int64(0)
	if info, err := os.Stat(path); err == nil {
		size = info.Size()
	}
	fmt.Fprintf(os.Stderr, "images: %s -> %s (%s, %.1f MB, %.1fs)\n",
		ref, path, arch, float64(size)/1e6, time.Since(start).Seconds())
}

// withScratch runs f with a directory for the build's files, removed after f: the images f
// builds read their layers from it, so f must write them before it returns.
func withScratch(f func(scratch string) error) error {
	scratch, err := os.MkdirTemp("", "subflow-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	return f(scratch)
}

// writeAtomic has write fill a temporary file that becomes path only when it succeeded.
func writeAtomic(path string, write func(tmp string) error) error {
	tmp := path + ".tmp"
	if err := write(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
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

// build assembles c's image for arch; its layer is a file in scratch.
func build(ctx context.Context, c component, arch, scratch string, o options) (v1.Image, error) {
	dir, err := os.MkdirTemp(scratch, arch+"-")
	if err != nil {
		return nil, err
	}
	var root rootFS
	if c.goPkg != "" {
		root, err = goBinary(ctx, c, arch, dir, o.tag)
	} else {
		root, err = c.root(ctx, arch, dir)
	}
	if err != nil {
		return nil, err
	}
	return image(ctx, root, arch, filepath.Join(dir, "layer.tar"), o)
}

// image is one layer, written to layerFile, with the config that runs it. OCI layouts get OCI
// media types throughout; docker archives keep docker's.
func image(ctx context.Context, root rootFS, arch, layerFile string, o options) (v1.Image, error) {
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
	layerOpts := []tarball.LayerOption{tarball.WithCompressedCaching}
	base := empty.Image
	if o.oci {
		layerOpts = append(layerOpts, tarball.WithMediaType(types.OCILayer))
		base = mutate.ConfigMediaType(mutate.MediaType(base, types.OCIManifestSchema1), types.OCIConfigJSON)
	}
	layer, err := tarball.LayerFromFile(layerFile, layerOpts...)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base, layer)
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
	if len(o.labels) > 0 {
		cfg.Config.Labels = map[string]string{}
		for k, v := range o.labels {
			cfg.Config.Labels[k] = v
		}
	}
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

// versionVar is where a subflow binary's agent reads the release it was built for: the agents
// in the sidecar and the example consumer report it to the controller (status.agents[].agentVersion,
// kubectl subflow status), which the build info of a main module cannot give.
const versionVar = "github.com/subflow-dev/subflow/agent/control.linkedVersion"

// goBinary builds c's static Go binary for arch, stamped with the images' tag as its release.
func goBinary(ctx context.Context, c component, arch, scratch, tag string) (rootFS, error) {
	bin := filepath.Join(scratch, "bin")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -X "+versionVar+"="+tag, "-o", bin, c.goPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return rootFS{}, fmt.Errorf("go build %s: %w", c.goPkg, err)
	}
	return rootFS{files: map[string]string{"/" + c.image: bin}, entrypoint: []string{"/" + c.image}}, nil
}
