package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// addSharedLibs adds every shared library that the tree's dynamically linked files load, and
// those that the files in also load (native libraries the image carries inside other files, as
// in a jar, which its runtime extracts), as ldd on this machine resolves them, the dynamic
// loader included. Each goes at the path ldd names, so the image's loader finds it where this
// machine's does. A library the tree already copies (a runtime's own, found through its
// RUNPATH, $ORIGIN or the image's LD_LIBRARY_PATH) is not added twice. A library ldd does not
// find is an error unless the tree carries a file of that name, which its runtime loads by a
// path it knows (the JVM's libjvm.so).
func (t tree) addSharedLibs(ctx context.Context, also []string) error {
	have := t.sources()
	files := map[string]string{} // a file on this machine -> what to call it in errors
	for p, e := range t {
		if e.src != "" {
			files[e.src] = "/" + p
		}
	}
	for _, f := range also {
		files[f] = f
	}
	libs := map[string]string{} // library -> the first file that needs it
	for _, src := range sortedKeys(files) {
		if !dynamic(src) {
			continue
		}
		found, missing, err := ldd(ctx, src)
		if err != nil {
			return err
		}
		for _, name := range missing {
			if !t.hasBase(name) {
				return fmt.Errorf("%s needs %s, which ldd does not find on this machine", files[src], name)
			}
		}
		for _, lib := range found {
			if _, ok := libs[lib]; !ok {
				libs[lib] = files[src]
			}
		}
	}
	for _, lib := range sortedKeys(libs) {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			return fmt.Errorf("%s needs %s: %w", libs[lib], lib, err)
		}
		if have[real] {
			continue
		}
		if err := t.addFile(lib[1:], lib); err != nil {
			return fmt.Errorf("%s needs %s: %w", libs[lib], lib, err)
		}
	}
	return nil
}

// dynamic reports whether file is an ELF file for this machine that loads shared libraries (a
// static Go binary does not; nor does anything that is not ELF, and ldd cannot list another
// machine's).
func dynamic(file string) bool {
	f, err := elf.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	if f.Machine != hostMachine[runtime.GOARCH] {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return true
		}
	}
	return false
}

var hostMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// ldd lists the absolute paths of the libraries file loads and the names of those ldd does not
// find. Its lines read "name => /path (addr)", "/path (addr)" (the loader), "name (addr)" (the
// vDSO, which is no file) or "name => not found".
func ldd(ctx context.Context, file string) (found, missing []string, err error) {
	out, err := exec.CommandContext(ctx, "ldd", file).CombinedOutput()
	if err != nil {
		return nil, nil, fmt.Errorf("ldd %s: %w: %s", file, err, bytes.TrimSpace(out))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 3 && fields[1] == "=>" && fields[2] == "not":
			missing = append(missing, fields[0])
		case len(fields) >= 3 && fields[1] == "=>" && filepath.IsAbs(fields[2]):
			found = append(found, filepath.Clean(fields[2]))
		case len(fields) >= 1 && filepath.IsAbs(fields[0]):
			found = append(found, filepath.Clean(fields[0]))
		}
	}
	return found, missing, sc.Err()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
