package main

import (
	"archive/tar"
	"context"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// OCI annotation keys on the layout's entry for the index (image-spec annotations.md), and the
// one containerd's import reads the image's full name from.
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerName = "io.containerd.image.name"
)

// writeOCI writes <out>/<n>.oci.tar: an OCI image layout whose index.json names one image
// index, the image for each architecture with its platform, tagged ref. The images' labels
// are the index's annotations too.
func writeOCI(ctx context.Context, c component, n string, ref name.Tag, o options) error {
	path := filepath.Join(o.out, n+".oci.tar")
	start := time.Now()
	return withScratch(func(scratch string) error {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, arch := range o.archs {
			img, err := build(ctx, c, arch, scratch, o)
			if err != nil {
				return err
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
			})
		}
		if len(o.labels) > 0 {
			idx = mutate.Annotations(idx, o.labels).(v1.ImageIndex)
		}
		dir := filepath.Join(scratch, "layout")
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			return err
		}
		err = lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
			annotationRefName:       ref.TagStr(),
			annotationContainerName: ref.String(), // a bare name stays bare, as in the docker archives
		}))
		if err != nil {
			return err
		}
		if err := writeAtomic(path, func(tmp string) error { return writeFile(tmp, tarDir(dir)) }); err != nil {
			return err
		}
		report(ref.String(), path, strings.Join(o.archs, ","), start)
		return nil
	})
}

// tarDir is a writer of dir's files as a tar with paths relative to dir, in walk (lexical)
// order, owned by root and dated epoch, so the same layout gives the same bytes.
func tarDir(dir string) func(w io.Writer) error {
	return func(w io.Writer) error {
		tw := tar.NewWriter(w)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == dir {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Typeflag: tar.TypeDir, Mode: 0o755}
			if d.IsDir() {
				hdr.Name += "/"
				return tw.WriteHeader(hdr)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, info.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			return copyFile(tw, p, hdr.Size)
		})
		if err != nil {
			return err
		}
		return tw.Close()
	}
}
