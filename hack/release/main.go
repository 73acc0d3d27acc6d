// Command release writes subflow's release artifacts into one directory, and checks them.
//
//	go run ./hack/release -version 1.2.3 [-registry R] [-url BASE] [-out dist/release]
//	go run ./hack/release -check -version 1.2.3 [-out dist/release]
//
// The artifacts (make release VERSION=1.2.3):
//
//   - controller.oci.tar and sidecar.oci.tar: OCI image layouts, each one index of a linux/amd64
//     and a linux/arm64 image, built by hack/images (the path make images and make e2e use);
//   - subflow-<version>.tgz: the chart, its version and appVersion the release's;
//   - kubectl-subflow_<os>_<arch>.tar.gz for linux and darwin on amd64 and arm64: the plugin
//     (stamped with the version: kubectl subflow version prints it), its completion helper
//     kubectl_complete-subflow and LICENSE;
//   - subflow.yaml: the krew plugin manifest naming those archives, at -url when given (krew
//     installs it with --manifest and --archive without it);
//   - SHA256SUMS: every other file's digest, as sha256sum -c reads it.
//
// -check (make release-check) reads them back as a user's tools would and fails on any that is
// wrong: see check.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"time"
)

// The platforms the plugin is built for, and the architectures of the images.
var (
	pluginPlatforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}
	imageArchs      = []string{"amd64", "arm64"}
)

// The images the release ships: hack/images' component name, and the binary each runs.
var releaseImages = []releaseImage{
	{component: "controller", entrypoint: "/subflow-controller"},
	{component: "sidecar", entrypoint: "/subflow-sidecar", agent: true},
}

type platform struct{ os, arch string }

type releaseImage struct {
	component, entrypoint string
	// agent: the binary holds an agent, which reports the release the image build linked in.
	agent bool
}

// OCI label keys (image-spec annotations.md) every image carries.
const (
	labelVersion  = "org.opencontainers.image.version"
	labelSource   = "org.opencontainers.image.source"
	labelRevision = "org.opencontainers.image.revision"
)

// semVer is a release version as helm and krew read it, without the leading v.
var semVer = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func main() {
	version := flag.String("version", "", "the release's version, x.y.z (SemVer, no leading v)")
	out := flag.String("out", "dist/release", "the directory of the artifacts (replaced by a build)")
	registry := flag.String("registry", "", "registry and path the image names start with (empty: bare names)")
	url := flag.String("url", "", "where the plugin archives will be published, for the krew manifest's uri (empty: the bare file names)")
	checkOnly := flag.Bool("check", false, "check the artifacts in -out instead of building them")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	var err error
	switch {
	case !semVer.MatchString(*version):
		err = fmt.Errorf("-version %q: want a SemVer version such as 1.2.3 (no leading v)", *version)
	case *checkOnly:
		err = check(ctx, *out, *version)
	default:
		err = build(ctx, buildOptions{out: *out, version: *version, registry: *registry, url: *url,
			source: source(), revision: revision(ctx)})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	what := "built"
	if *checkOnly {
		what = "checked"
	}
	fmt.Fprintf(os.Stderr, "release: %s %s in %.1fs\n", what, *out, time.Since(start).Seconds())
}

// source is the project's address, from the module path this program was built in.
func source() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Path != "" {
		return "https://" + info.Main.Path
	}
	return ""
}
