package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// The Java and Python peers (hack/clients) run on runtimes taken from this machine: the JDK's
// jlink makes a JRE, the Python the venv was made from is copied with its standard library, and
// addSharedLibs brings the system libraries they load. So these images are built for this
// machine's architecture only, from what `make clients-fetch` prepared.

// jdk is the JDK whose jlink makes the Java peer's runtime; the peer is compiled for 17.
const jdk = "/usr/lib/jvm/java-17-openjdk-amd64"

// javaModules are the JDK modules the Java peer runs on. jdeps --print-module-deps on the
// client's jars also names java.desktop and java.compiler, for java.beans and annotation
// references in shaded code a consumer does not run; they would bring AWT and the X11
// libraries. jdk.naming.dns is where netty finds name servers when /etc/resolv.conf has none.
const javaModules = "java.base,java.logging,java.management,java.naming,java.net.http," +
	"java.security.jgss,java.sql,java.xml,jdk.crypto.ec,jdk.naming.dns,jdk.unsupported"

// javaPeer is hack/clients/java's Peer with its classpath on a jlink-made JRE at /opt/java.
func javaPeer(ctx context.Context, arch, scratch string) (rootFS, error) {
	if err := hostArch(arch); err != nil {
		return rootFS{}, err
	}
	cache, err := preparePeer(ctx, "hack/clients/java/peer.sh")
	if err != nil {
		return rootFS{}, err
	}
	jre := filepath.Join(scratch, "jre")
	jlink := exec.CommandContext(ctx, filepath.Join(jdk, "bin", "jlink"), "--add-modules", javaModules,
		"--strip-debug", "--no-header-files", "--no-man-pages", "--output", jre)
	if out, err := jlink.CombinedOutput(); err != nil {
		return rootFS{}, fmt.Errorf("jlink: %w: %s", err, bytes.TrimSpace(out))
	}
	files := map[string]string{"/opt/java": jre}
	jars, classpath, err := peerClasspath(cache, files)
	if err != nil {
		return rootFS{}, err
	}
	natives, err := jarNatives(jars, filepath.Join(scratch, "native"))
	if err != nil {
		return rootFS{}, err
	}
	return rootFS{files: files, loads: natives, entrypoint: []string{"/opt/java/bin/java",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath, "dev.subflow.peer.Peer"}}, nil
}

// peerClasspath adds the compiled Peer and the jars of the classpath peer.sh resolved to files,
// under /opt/peer, and returns the jars and the classpath in the image (in peer.sh's order).
func peerClasspath(cache string, files map[string]string) (jars []string, classpath string, err error) {
	data, err := os.ReadFile(filepath.Join(cache, "classpath.txt"))
	if err != nil {
		return nil, "", err
	}
	files["/opt/peer/classes"] = filepath.Join(cache, "classes")
	paths := []string{"/opt/peer/classes"}
	jars = strings.Split(strings.TrimSpace(string(data)), ":")
	for _, jar := range jars {
		at := "/opt/peer/lib/" + filepath.Base(jar)
		if _, dup := files[at]; dup {
			return nil, "", fmt.Errorf("two jars named %s on the classpath", filepath.Base(jar))
		}
		files[at] = jar
		paths = append(paths, at)
	}
	return jars, strings.Join(paths, ":"), nil
}

// jarNatives extracts the native libraries in jars (netty's, which it extracts to /tmp and
// loads at run time) into dir and returns their paths.
func jarNatives(jars []string, dir string) ([]string, error) {
	var out []string
	for i, jar := range jars {
		zr, err := zip.OpenReader(jar)
		if err != nil {
			return nil, err
		}
		for _, f := range zr.File {
			if !strings.HasSuffix(f.Name, ".so") {
				continue
			}
			if !filepath.IsLocal(f.Name) {
				zr.Close()
				return nil, fmt.Errorf("%s: %s is outside the jar", jar, f.Name)
			}
			dst := filepath.Join(dir, strconv.Itoa(i), f.Name)
			if err := extract(f, dst); err != nil {
				zr.Close()
				return nil, fmt.Errorf("%s: %w", jar, err)
			}
			out = append(out, dst)
		}
		zr.Close()
	}
	return out, nil
}

func extract(f *zip.File, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	r, err := f.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	return writeFile(dst, func(w io.Writer) error {
		_, err := io.Copy(w, r)
		return err
	})
}

// pythonPeer is hack/clients/python's peer.py on the interpreter its venv was made from.
func pythonPeer(ctx context.Context, arch, _ string) (rootFS, error) {
	if err := hostArch(arch); err != nil {
		return rootFS{}, err
	}
	venv, err := preparePeer(ctx, "hack/clients/python/peer.sh")
	if err != nil {
		return rootFS{}, err
	}
	py, err := venvPython(venv)
	if err != nil {
		return rootFS{}, err
	}
	return py.root("hack/clients/python/peer.py"), nil
}

// root is the file system that runs peer on the interpreter at /opt/python, with the venv's
// packages as the interpreter's own site-packages.
func (py python) root(peer string) rootFS {
	prefix := "/opt/python"
	files := map[string]string{
		prefix + "/bin/python3":                          py.binary,
		prefix + "/lib/" + py.version:                    py.stdlib,
		prefix + "/lib/" + py.version + "/site-packages": py.site,
		"/peer.py": peer,
	}
	env := []string{"PYTHONHOME=" + prefix, "PYTHONDONTWRITEBYTECODE=1"}
	if py.libpython != "" {
		// The interpreter's RUNPATH names its directory on this machine.
		files[prefix+"/lib/"+filepath.Base(py.libpython)] = py.libpython
		env = append(env, "LD_LIBRARY_PATH="+prefix+"/lib")
	}
	return rootFS{files: files, skip: py.skip, env: env,
		entrypoint: []string{prefix + "/bin/python3", "-u", "/peer.py"}}
}

// python is an interpreter on this machine and the venv made from it.
type python struct {
	version   string // python3.11: the name of its lib directories
	binary    string
	libpython string // empty when the interpreter links it statically
	stdlib    string
	site      string // the venv's site-packages
}

// venvPython finds the interpreter of venv by its pyvenv.cfg's home (the directory of the
// interpreter it was made from, whose parent is the prefix holding lib/pythonX.Y).
func venvPython(venv string) (python, error) {
	home, err := pyvenvHome(filepath.Join(venv, "pyvenv.cfg"))
	if err != nil {
		return python{}, err
	}
	sites, _ := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	if len(sites) != 1 {
		return python{}, fmt.Errorf("%s: want one lib/python3.*/site-packages, found %d", venv, len(sites))
	}
	version := filepath.Base(filepath.Dir(sites[0]))
	binary, err := filepath.EvalSymlinks(filepath.Join(home, "python3"))
	if err != nil {
		return python{}, err
	}
	prefix := filepath.Dir(home)
	py := python{version: version, binary: binary, site: sites[0],
		stdlib: filepath.Join(prefix, "lib", version)}
	if _, err := os.Stat(filepath.Join(py.stdlib, "os.py")); err != nil {
		return python{}, fmt.Errorf("no standard library of %s at %s: %w", binary, py.stdlib, err)
	}
	if lib := filepath.Join(prefix, "lib", "lib"+version+".so.1.0"); fileExists(lib) {
		py.libpython = lib
	}
	return py, nil
}

func pyvenvHome(cfg string) (string, error) {
	data, err := os.ReadFile(cfg)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.TrimSpace(key) == "home" {
			return strings.TrimSpace(value), nil
		}
	}
	return "", fmt.Errorf("%s names no home", cfg)
}

// skip leaves out what a consumer does not run: bytecode caches (their source times would not
// match the layer's), the standard library's tests, GUI, installer and static library, the
// interpreter's own site-packages (the venv's replace it), and the venv's installers.
func (py python) skip(src string) bool {
	base := filepath.Base(src)
	if base == "__pycache__" {
		return true
	}
	switch filepath.Dir(src) {
	case py.stdlib:
		switch base {
		case "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages":
			return true
		}
		return strings.HasPrefix(base, "config-")
	case filepath.Join(py.stdlib, "lib-dynload"):
		return strings.HasPrefix(base, "_tkinter")
	case py.site:
		for _, tool := range []string{"pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth"} {
			if base == tool || strings.HasPrefix(base, tool+"-") {
				return true
			}
		}
	}
	return false
}

// preparePeer runs a peer's script with --prepare (it fetches the client on first use) and
// returns the directory it prints.
func preparePeer(ctx context.Context, script string) (string, error) {
	cmd := exec.CommandContext(ctx, script, "--prepare")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --prepare: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	if !filepath.IsAbs(dir) || !fileExists(dir) {
		return "", fmt.Errorf("%s --prepare printed %q, not a directory", script, dir)
	}
	return dir, nil
}

// hostArch refuses a peer image for another architecture than this machine's: its runtime is
// this machine's.
func hostArch(arch string) error {
	if arch != runtime.GOARCH {
		return fmt.Errorf("assembled from this machine's runtime, so only for -arch %s", runtime.GOARCH)
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
