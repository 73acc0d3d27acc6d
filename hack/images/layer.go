package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"
)

// epoch is every entry's time, so the same files give the same layer digest.
var epoch = time.Unix(0, 0)

// A tree is an image's file system, its entries by path in the image (no leading slash), each
// regular file naming the file on this machine that holds its bytes. Every entry is owned by
// root, dated epoch and readable by everyone: the images run as nonRoot, and files taken from
// this machine (a venv under /root, say) often are not.
type tree map[string]*entry

type entry struct {
	hdr tar.Header
	src string // regular files: the file on this machine, links resolved
}

// newTree holds files (path in the image -> file or directory on this machine) and an empty
// sticky /tmp that the runtimes write their scratch files to. skip, if set, leaves out the files
// and directories of this machine it returns true for.
//
// A file is taken by what it names: a symbolic link becomes the file it points to. A
// directory's symbolic links stay links when their relative target stays inside that
// directory, so the image holds what the link points to; any other link becomes a copy of its
// target's file.
func newTree(files map[string]string, skip func(src string) bool) (tree, error) {
	t := tree{"tmp": {hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o1777}}}
	for _, dst := range sortedKeys(files) {
		if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
			return nil, fmt.Errorf("image path %q: want a clean absolute path below /", dst)
		}
		if err := t.addTree(dst[1:], files[dst], skip); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// addTree adds src at dst, walking it when it is a directory.
func (t tree) addTree(dst, src string, skip func(string) bool) error {
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return t.addFile(dst, src)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skip != nil && skip(p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		at := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return t.add(at, &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}})
		case d.Type()&fs.ModeSymlink != 0:
			return t.addLink(at, p, src)
		default:
			return t.addFile(at, p)
		}
	})
}

// addLink keeps the link at p when its target stays inside root, and copies what it points to
// otherwise.
func (t tree) addLink(dst, p, root string) error {
	target, err := os.Readlink(p)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(target) {
		rel, err := filepath.Rel(root, filepath.Join(filepath.Dir(p), target))
		if err == nil && filepath.IsLocal(rel) {
			return t.add(dst, &entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}})
		}
	}
	info, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%s: a link out of %s to nothing: %w", p, root, err)
	}
	if info.IsDir() {
		return fmt.Errorf("%s: a link out of %s to a directory: map that directory instead", p, root)
	}
	return t.addFile(dst, p)
}

// addFile adds the regular file src names (through any links) at dst, executable by everyone
// when its owner may execute it.
func (t tree) addFile(dst, src string) error {
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	info, err := os.Stat(real)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file or directory", src)
	}
	mode := int64(0o644)
	if info.Mode()&0o100 != 0 {
		mode = 0o755
	}
	return t.add(dst, &entry{src: real, hdr: tar.Header{Typeflag: tar.TypeReg, Mode: mode, Size: info.Size()}})
}

// add puts e at dst and the directories above it. Two sources for one path are an error unless
// both are directories or the same file.
func (t tree) add(dst string, e *entry) error {
	if old, ok := t[dst]; ok {
		same := old.hdr.Typeflag == e.hdr.Typeflag && old.src == e.src && old.hdr.Linkname == e.hdr.Linkname
		if !same {
			return fmt.Errorf("/%s comes from both %s and %s", dst, describe(old), describe(e))
		}
		return nil
	}
	t[dst] = e
	if dir := path.Dir(dst); dir != "." {
		return t.add(dir, &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}})
	}
	return nil
}

func describe(e *entry) string {
	switch e.hdr.Typeflag {
	case tar.TypeDir:
		return "a directory"
	case tar.TypeSymlink:
		return "a link to " + e.hdr.Linkname
	}
	return e.src
}

// write writes the tree as an uncompressed tar, its entries in path order.
func (t tree) write(w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, p := range sortedKeys(t) {
		e := t[p]
		hdr := e.hdr
		hdr.Name, hdr.ModTime = p, epoch
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFile(tw, e.src, hdr.Size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// copyFile copies the size bytes the tree recorded for src; a file that changed size since is an
// error rather than a short or overlong entry.
func copyFile(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(w, f, size); err != nil {
		return fmt.Errorf("%s: %w (did it change during the build?)", src, err)
	}
	if n, _ := f.Read(make([]byte, 1)); n != 0 {
		return fmt.Errorf("%s grew during the build", src)
	}
	return nil
}

// hasBase reports whether the tree holds a file named base anywhere.
func (t tree) hasBase(base string) bool {
	for p := range t {
		if path.Base(p) == base {
			return true
		}
	}
	return false
}

// sources are the files on this machine the tree copies.
func (t tree) sources() map[string]bool {
	out := map[string]bool{}
	for _, e := range t {
		if e.src != "" {
			out[e.src] = true
		}
	}
	return out
}
