package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// layerEntry is what a reader of the layer sees of one entry.
type layerEntry struct {
	typ      byte
	mode     int64
	link     string
	contents string
}

// readLayer reads a layer's tar, failing the test on any entry not owned by root and dated epoch.
func readLayer(t *testing.T, data []byte) map[string]layerEntry {
	t.Helper()
	out := map[string]layerEntry{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" || !hdr.ModTime.Equal(epoch) {
			t.Errorf("%s: owner %d:%d (%q:%q), time %s; want 0:0 and the epoch", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.ModTime)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[hdr.Name] = layerEntry{typ: hdr.Typeflag, mode: hdr.Mode, link: hdr.Linkname, contents: string(body)}
	}
}

func writeTree(t *testing.T, files map[string]string, skip func(string) bool) []byte {
	t.Helper()
	tr, err := newTree(files, skip)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tr.write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustWrite(t *testing.T, p, contents string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(contents), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func TestLayerModesOwnersAndLinks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	mustWrite(t, filepath.Join(src, "data"), "data", 0o600)
	mustWrite(t, filepath.Join(src, "bin", "tool"), "tool", 0o700)
	mustWrite(t, filepath.Join(src, "cache", "junk"), "junk", 0o600)
	mustWrite(t, filepath.Join(dir, "outside"), "outside", 0o600)
	if err := os.Chmod(filepath.Join(src, "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	mustLink(t, "../data", filepath.Join(src, "bin", "inside"))        // stays in src: kept
	mustLink(t, "../outside", filepath.Join(src, "escapes"))           // leaves src: copied
	mustLink(t, filepath.Join(src, "data"), filepath.Join(src, "abs")) // absolute: copied
	mustLink(t, filepath.Join(dir, "outside"), filepath.Join(dir, "single"))
	files := map[string]string{"/opt/app": src, "/etc/single": filepath.Join(dir, "single")}
	skip := func(p string) bool { return filepath.Base(p) == "cache" }

	data := writeTree(t, files, skip)
	got := readLayer(t, data)
	want := map[string]layerEntry{
		"etc/":               {typ: tar.TypeDir, mode: 0o755},
		"etc/single":         {typ: tar.TypeReg, mode: 0o644, contents: "outside"},
		"opt/":               {typ: tar.TypeDir, mode: 0o755},
		"opt/app/":           {typ: tar.TypeDir, mode: 0o755},
		"opt/app/abs":        {typ: tar.TypeReg, mode: 0o644, contents: "data"},
		"opt/app/bin/":       {typ: tar.TypeDir, mode: 0o755},
		"opt/app/bin/inside": {typ: tar.TypeSymlink, mode: 0o777, link: "../data"},
		"opt/app/bin/tool":   {typ: tar.TypeReg, mode: 0o755, contents: "tool"},
		"opt/app/data":       {typ: tar.TypeReg, mode: 0o644, contents: "data"},
		"opt/app/escapes":    {typ: tar.TypeReg, mode: 0o644, contents: "outside"},
		"tmp/":               {typ: tar.TypeDir, mode: 0o1777},
	}
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: missing", name)
		} else if g != w {
			t.Errorf("%s: got %+v, want %+v", name, g, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: in the layer, not wanted", name)
		}
	}
	if again := writeTree(t, files, skip); !bytes.Equal(again, data) {
		t.Error("the same files gave two different layers")
	}
}

func TestLayerRefusesWhatItCannotCopy(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "a"), "a", 0o644)
	mustWrite(t, filepath.Join(dir, "b"), "b", 0o644)
	mustWrite(t, filepath.Join(dir, "tree", "a"), "in tree", 0o644)
	mustWrite(t, filepath.Join(dir, "linkdir", "x"), "x", 0o644)
	mustLink(t, "../a", filepath.Join(dir, "linkdir", "up")) // leaves linkdir: a copy of a
	dangling := filepath.Join(dir, "dangling")
	mustWrite(t, filepath.Join(dangling, "x"), "x", 0o644)
	mustLink(t, "../nothing", filepath.Join(dangling, "broken"))
	toDir := filepath.Join(dir, "todir")
	mustWrite(t, filepath.Join(toDir, "x"), "x", 0o644)
	mustLink(t, "../tree", filepath.Join(toDir, "sub"))
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"relative image path", map[string]string{"opt/a": filepath.Join(dir, "a")}, "clean absolute path"},
		{"unclean image path", map[string]string{"/opt/../a": filepath.Join(dir, "a")}, "clean absolute path"},
		{"the root", map[string]string{"/": filepath.Join(dir, "tree")}, "clean absolute path"},
		{"two files at one path", map[string]string{"/x/a": filepath.Join(dir, "b"), "/x": filepath.Join(dir, "tree")}, "comes from both"},
		{"a file where a directory is", map[string]string{"/x": filepath.Join(dir, "a"), "/x/y": filepath.Join(dir, "b")}, "comes from both"},
		{"a link and a file at one path", map[string]string{"/x": filepath.Join(dir, "linkdir"), "/x/up": filepath.Join(dir, "b")}, "comes from both"},
		{"a link out to nothing", map[string]string{"/x": dangling}, "to nothing"},
		{"a link out to a directory", map[string]string{"/x": toDir}, "to a directory"},
		{"a missing source", map[string]string{"/x": filepath.Join(dir, "missing")}, "no such file"},
		{"a fifo", map[string]string{"/x": fifo}, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTree(tc.files, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// The same file twice at one path is no conflict.
	if _, err := newTree(map[string]string{"/x": filepath.Join(dir, "linkdir"), "/x/up": filepath.Join(dir, "a")}, nil); err != nil {
		t.Fatalf("a link's copy and its target at one path: %v", err)
	}
}

func TestSharedLibsFollowLdd(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("needs a dynamically linked sh")
	}
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("needs ldd")
	}
	sh, err = filepath.EvalSymlinks(sh)
	if err != nil || !dynamic(sh) {
		t.Skipf("%s is no dynamically linked ELF file for this machine", sh)
	}
	found, _, err := ldd(context.Background(), sh)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := newTree(map[string]string{"/bin/sh": sh}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.addSharedLibs(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	var libc bool
	for _, lib := range found {
		e, ok := tr[lib[1:]]
		if !ok || e.hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s (which sh loads) is not a regular file at its path in the image", lib)
		}
		libc = libc || strings.HasPrefix(path.Base(lib), "libc.so")
	}
	if !libc {
		t.Errorf("ldd %s named no libc: %q", sh, found)
	}
	// A library the image carries already is not copied again.
	libcPath := ""
	for _, lib := range found {
		if strings.HasPrefix(path.Base(lib), "libc.so") {
			libcPath = lib
		}
	}
	tr, err = newTree(map[string]string{"/bin/sh": sh, "/opt/rt/libc.so.6": libcPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.addSharedLibs(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := tr[libcPath[1:]]; ok {
		t.Errorf("%s copied twice: at /opt/rt/libc.so.6 and at %s", libcPath, libcPath)
	}
}

func TestImageRef(t *testing.T) {
	for _, tc := range []struct{ registry, want string }{
		{"", "subflow-controller:dev"},
		{"subflow.local", "subflow.local/subflow-controller:dev"},
		{"registry.example:5000/team", "registry.example:5000/team/subflow-controller:dev"},
	} {
		ref, err := imageRef(tc.registry, "subflow-controller", "dev")
		if err != nil {
			t.Errorf("registry %q: %v", tc.registry, err)
			continue
		}
		if ref.String() != tc.want {
			t.Errorf("registry %q: archive names %s, want %s", tc.registry, ref.String(), tc.want)
		}
	}
	if _, err := imageRef("", "Bad Name", "dev"); err == nil {
		t.Error("an invalid name was accepted")
	}
}

// The Python peer's file system from a venv: the interpreter found through pyvenv.cfg's home,
// its standard library without what a consumer does not run, the venv's packages without its
// installers, and no bytecode caches anywhere.
func TestPythonRootFromVenv(t *testing.T) {
	dir := t.TempDir()
	prefix, venv := filepath.Join(dir, "pyenv", "3.11.7"), filepath.Join(dir, "venv")
	for _, f := range []string{
		"bin/python3.11", "lib/libpython3.11.so.1.0", "lib/python3.11/os.py",
		"lib/python3.11/__pycache__/os.cpython-311.pyc", "lib/python3.11/json/__init__.py",
		"lib/python3.11/json/__pycache__/__init__.cpython-311.pyc", "lib/python3.11/test/test_os.py",
		"lib/python3.11/idlelib/idle.py", "lib/python3.11/tkinter/__init__.py",
		"lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11.a",
		"lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
		"lib/python3.11/lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
		"lib/python3.11/site-packages/boto3/__init__.py",
	} {
		mustWrite(t, filepath.Join(prefix, f), f, 0o700)
	}
	mustLink(t, "python3.11", filepath.Join(prefix, "bin", "python3"))
	for _, f := range []string{
		"lib/python3.11/site-packages/pulsar/__init__.py", "lib/python3.11/site-packages/pulsar/__pycache__/x.pyc",
		"lib/python3.11/site-packages/pip/__init__.py", "lib/python3.11/site-packages/pip-23.2.1.dist-info/METADATA",
		"lib/python3.11/site-packages/pulsar_client-3.13.0.dist-info/METADATA",
		"lib/python3.11/site-packages/distutils-precedence.pth", "lib/python3.11/site-packages/_distutils_hack/__init__.py",
	} {
		mustWrite(t, filepath.Join(venv, f), f, 0o600)
	}
	mustWrite(t, filepath.Join(venv, "pyvenv.cfg"), "home = "+filepath.Join(prefix, "bin")+"\nversion = 3.11.7\n", 0o600)
	mustWrite(t, filepath.Join(dir, "peer.py"), "peer", 0o600)

	py, err := venvPython(venv)
	if err != nil {
		t.Fatal(err)
	}
	root := py.root(filepath.Join(dir, "peer.py"))
	got := readLayer(t, writeTree(t, root.files, root.skip))
	var files []string
	for name, e := range got {
		if e.typ == tar.TypeReg {
			files = append(files, name)
		}
	}
	want := []string{
		"opt/python/bin/python3", "opt/python/lib/libpython3.11.so.1.0", "opt/python/lib/python3.11/json/__init__.py",
		"opt/python/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so", "opt/python/lib/python3.11/os.py",
		"opt/python/lib/python3.11/site-packages/pulsar/__init__.py",
		"opt/python/lib/python3.11/site-packages/pulsar_client-3.13.0.dist-info/METADATA", "peer.py",
	}
	slices.Sort(files)
	if !slices.Equal(files, want) {
		t.Errorf("files:\n got %q\nwant %q", files, want)
	}
	if e := got["opt/python/bin/python3"]; e.contents != "bin/python3.11" || e.mode != 0o755 {
		t.Errorf("python3: %+v, want the interpreter python3 links to, executable by everyone", e)
	}
	wantEnv := []string{"PYTHONHOME=/opt/python", "PYTHONDONTWRITEBYTECODE=1", "LD_LIBRARY_PATH=/opt/python/lib"}
	if !slices.Equal(root.env, wantEnv) || !slices.Equal(root.entrypoint, []string{"/opt/python/bin/python3", "-u", "/peer.py"}) {
		t.Errorf("env %q, entrypoint %q", root.env, root.entrypoint)
	}
}
