package microvm

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// pythonBinary is the interpreter the guest's /usr image carries, with
// its standard library and the shared libraries they need.
var pythonBinary = "/usr/bin/python3"

// libDirs are where shared libraries are looked up (Debian's multiarch).
var libDirs = []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"}

// usrFiles lists the host files of the guest's /usr: python3 (its link
// and its binary), its standard library (without its test suite), and
// every shared library the binary and the standard library's extension
// modules need, with the dynamic loader. Paths are host paths under /usr.
func usrFiles() ([]string, error) {
	bin, err := filepath.EvalSymlinks(pythonBinary)
	if err != nil {
		return nil, fmt.Errorf("microvm: python: %w", err)
	}
	ver := filepath.Base(bin) // python3.11
	stdlib := filepath.Join("/usr/lib", ver)
	files := []string{pythonBinary, bin}
	var elfs []string
	elfs = append(elfs, bin)
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == filepath.Join(stdlib, "test") || d.Name() == "__pycache__" || d.Name() == "site-packages") {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasSuffix(p, ".so") {
			elfs = append(elfs, p) // added below if its libraries are all here
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("microvm: python standard library: %w", err)
	}
	seen := map[string]bool{}
	need := func(path string, libs *[]string) error {
		var found []string
		if err := neededLibs(path, seen, &found); err != nil {
			return err
		}
		// Under /usr whichever directory each was found in (merged /usr),
		// by its soname; staged with its content (stageFile follows links
		// such as /etc/alternatives').
		for _, l := range found {
			*libs = append(*libs, "/usr/lib/x86_64-linux-gnu/"+filepath.Base(l))
		}
		return nil
	}
	for i, e := range elfs {
		var libs []string
		before := make(map[string]bool, len(seen))
		for k := range seen {
			before[k] = true
		}
		if err := need(e, &libs); err != nil {
			if i == 0 {
				return nil, err // python3 itself
			}
			seen = before // an extension module whose libraries are not installed: left out
			continue
		}
		for _, l := range libs {
			seen[filepath.Base(l)] = true
		}
		files = append(files, libs...)
		if i > 0 {
			files = append(files, e)
		}
	}
	sort.Strings(files)
	out := files[:0]
	for i, f := range files {
		if i == 0 || f != files[i-1] {
			out = append(out, f)
		}
	}
	return out, nil
}

// UsrImage returns the path of the guest's read-only /usr, an EROFS image
// built at first use with mkfs.erofs, cached by content (each file's path,
// size and modification time: an upgrade of python3 makes a new one).
//
// The path is remembered for the process (walking the standard library
// and reading its extension modules' ELF headers costs a start); a
// server restart picks up an upgraded python3.
func UsrImage() (string, error) {
	usrMu.Lock()
	defer usrMu.Unlock()
	if usrPath != "" && cached(usrPath) && filepath.Dir(usrPath) == CacheDir {
		return usrPath, nil
	}
	p, err := buildUsrImage()
	if err == nil {
		usrPath = p
	}
	return p, err
}

var (
	usrMu   sync.Mutex
	usrPath string
)

func buildUsrImage() (string, error) {
	files, err := usrFiles()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "layout 2 (lib64 loader, lib/ssl links)\n")
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("microvm: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d %v\n", f, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
	}
	path := filepath.Join(CacheDir, "usr-"+hex.EncodeToString(h.Sum(nil))[:24]+".erofs")
	if err := ensureCacheDir(); err != nil {
		return "", err
	}
	if cached(path) {
		return path, nil
	}
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", fmt.Errorf("microvm: mkfs.erofs not found (apt-get install erofs-utils, or scripts/setup.sh)")
	}
	stage, err := os.MkdirTemp(CacheDir, ".usr-")
	if err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	defer os.RemoveAll(stage)
	if err := os.Chmod(stage, 0o755); err != nil { // the image's root: the guest's /usr
		return "", fmt.Errorf("microvm: %w", err)
	}
	for _, f := range files {
		if err := stageFile(f, filepath.Join(stage, strings.TrimPrefix(f, "/usr/"))); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Join(stage, "lib64"), 0o755); err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	if err := os.Symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(stage, "lib64", "ld-linux-x86-64.so.2")); err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	// OpenSSL's default trust store (OPENSSLDIR /usr/lib/ssl, as Debian
	// links it): the guest's /etc/ssl/certs, which the policy's files fill.
	if err := os.MkdirAll(filepath.Join(stage, "lib", "ssl"), 0o755); err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	for name, target := range map[string]string{"cert.pem": "/etc/ssl/certs/ca-certificates.crt", "certs": "/etc/ssl/certs"} {
		if err := os.Symlink(target, filepath.Join(stage, "lib", "ssl", name)); err != nil {
			return "", fmt.Errorf("microvm: %w", err)
		}
	}
	tmp := filepath.Join(CacheDir, "."+filepath.Base(path)+".tmp")
	defer os.Remove(tmp)
	if out, err := exec.Command(mkfs, "--quiet", "--all-root", tmp, stage).CombinedOutput(); err != nil {
		return "", fmt.Errorf("microvm: mkfs.erofs: %v: %s", err, out)
	}
	// QEMU runs unprivileged and opens it; nothing in it is secret.
	if err := os.Chmod(tmp, 0o644); err != nil {
		return "", fmt.Errorf("microvm: /usr image: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("microvm: /usr image: %w", err)
	}
	return path, nil
}

// stageFile copies src to dst, following symlinks except python3's own
// (python3 -> python3.11), which stays a link.
func stageFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("microvm: %w", err)
	}
	fi, err := os.Stat(src)
	if src == pythonBinary {
		fi, err = os.Lstat(src)
	}
	if err != nil {
		return fmt.Errorf("microvm: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		t, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("microvm: %w", err)
		}
		if err := os.Symlink(t, dst); err != nil && !os.IsExist(err) {
			return fmt.Errorf("microvm: %w", err)
		}
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("microvm: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		if os.IsExist(err) {
			return nil
		}
		return fmt.Errorf("microvm: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("microvm: copy %s: %w", src, err)
	}
	return out.Close()
}

// neededLibs adds to *found the host path (in libDirs) of every shared
// library the ELF file at path needs, and its dynamic loader (by its
// name, in libDirs too), recursively; sonames already in seen are
// skipped, and each one found is added to seen.
func neededLibs(path string, seen map[string]bool, found *[]string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("microvm: %s: %w", path, err)
	}
	names, _ := f.ImportedLibraries()
	if interp := elfInterp(f); interp != "" {
		names = append(names, filepath.Base(interp))
	}
	f.Close()
	for _, l := range names {
		if seen[l] {
			continue
		}
		at := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, l)); err == nil {
				at = filepath.Join(d, l)
				break
			}
		}
		if at == "" {
			return fmt.Errorf("microvm: %s needs %s, not found in %v", path, l, libDirs)
		}
		real, err := filepath.EvalSymlinks(at)
		if err != nil {
			return fmt.Errorf("microvm: %s: %w", at, err)
		}
		*found = append(*found, at)
		seen[l] = true
		if err := neededLibs(real, seen, found); err != nil {
			return err
		}
	}
	return nil
}

// elfInterp is f's dynamic loader (PT_INTERP), "" for a static binary.
func elfInterp(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}
