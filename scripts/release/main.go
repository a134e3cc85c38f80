// Command release builds airlock's release artifacts from a checkout:
// static CGO-free binaries per architecture, a tar.gz archive of each
// (binaries, docs, LICENSE, NOTICE, the systemd unit and every linked
// module's license), a .deb of each (nfpm), an OCI image layout holding
// one image per architecture (go-containerregistry, no Docker), a
// CycloneDX SBOM per architecture made from the binaries' own build
// information, and SHA256SUMS over all of them.
//
// Every timestamp is the commit's time and every archive is written in a
// fixed order with fixed owners, so the same checkout and Go toolchain give
// the same bytes. scripts/release.sh runs it; its own module (this
// directory) keeps nfpm and staticcheck out of airlock's module graph.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// config is what one release run builds.
type config struct {
	src     string    // the airlock checkout
	out     string    // output directory (created; must not exist or be empty)
	version string    // e.g. 0.2.0
	commit  string    // full VCS revision
	date    time.Time // the commit's time: every timestamp in the artifacts
	arches  []string
}

func main() {
	var c config
	var date, arches string
	flag.StringVar(&c.src, "src", ".", "the airlock checkout")
	flag.StringVar(&c.out, "out", "dist", "output directory")
	flag.StringVar(&c.version, "version", "", "release version (e.g. 0.2.0)")
	flag.StringVar(&c.commit, "commit", "", "the commit built (full revision)")
	flag.StringVar(&date, "date", "", "the commit's time, RFC 3339")
	flag.StringVar(&arches, "arch", "amd64,arm64", "comma-separated GOARCH values")
	flag.Parse()
	var err error
	if c.date, err = time.Parse(time.RFC3339, date); err != nil {
		fatal(fmt.Errorf("-date: %w", err))
	}
	c.date = c.date.UTC()
	if c.version == "" || c.commit == "" {
		fatal(errors.New("-version and -commit are required"))
	}
	c.arches = strings.Split(arches, ",")
	if err := run(c); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "release:", err)
	os.Exit(1)
}

func run(c config) error {
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	if ents, _ := os.ReadDir(c.out); len(ents) > 0 {
		return fmt.Errorf("%s is not empty", c.out)
	}
	docs, err := docFiles(c.src)
	if err != nil {
		return err
	}
	var images []archImage
	for _, arch := range c.arches {
		bins, err := build(c, arch)
		if err != nil {
			return err
		}
		mods, err := linkedModules(bins)
		if err != nil {
			return err
		}
		third, err := thirdPartyLicenses(mods)
		if err != nil {
			return err
		}
		files := append([]file{
			{name: "airlock", src: bins[0], mode: 0o755},
			{name: "airlock-agent", src: bins[1], mode: 0o755},
			{name: "airlock.service", src: filepath.Join(c.src, "deploy/systemd/airlock.service"), mode: 0o644},
			{name: "THIRD_PARTY_LICENSES", data: third, mode: 0o644},
		}, docs...)
		base := fmt.Sprintf("airlock-%s-linux-%s", c.version, arch)
		if err := writeArchive(filepath.Join(c.out, base+".tar.gz"), base, files, c.date); err != nil {
			return fmt.Errorf("archive %s: %w", arch, err)
		}
		if err := writeSBOM(filepath.Join(c.out, base+".cdx.json"), c, arch, mods); err != nil {
			return fmt.Errorf("sbom %s: %w", arch, err)
		}
		if err := writeDeb(c.out, c, arch, bins, third); err != nil {
			return fmt.Errorf("deb %s: %w", arch, err)
		}
		images = append(images, archImage{arch: arch, files: []file{
			{name: "airlock", src: bins[0], mode: 0o755},
			{name: "airlock-agent", src: bins[1], mode: 0o755},
			{name: "usr/share/doc/airlock/LICENSE", src: filepath.Join(c.src, "LICENSE"), mode: 0o644},
			{name: "usr/share/doc/airlock/NOTICE", src: filepath.Join(c.src, "NOTICE"), mode: 0o644},
			{name: "usr/share/doc/airlock/THIRD_PARTY_LICENSES", data: third, mode: 0o644},
		}})
	}
	if err := writeImage(filepath.Join(c.out, fmt.Sprintf("airlock-%s-oci", c.version)), c, images); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	os.RemoveAll(filepath.Join(c.out, "build"))
	return writeSums(c.out)
}

// build compiles airlock and airlock-agent for arch: static (CGO off),
// -trimpath, no build id, the version, commit and date linked in, and one
// agent build stamp for both so that serve uses the agent-only binary.
func build(c config, arch string) ([2]string, error) {
	dir, err := filepath.Abs(filepath.Join(c.out, "build", arch))
	if err != nil {
		return [2]string{}, err
	}
	ld := strings.Join([]string{"-s", "-w", "-buildid=",
		"-X", "github.com/airlock-dev/airlock/internal/version.version=" + c.version,
		"-X", "github.com/airlock-dev/airlock/internal/version.commit=" + c.commit,
		"-X", "github.com/airlock-dev/airlock/internal/version.date=" + c.date.Format(time.RFC3339),
		"-X", "github.com/airlock-dev/airlock/agent.stampOverride=release-" + c.version + "-" + c.commit,
	}, " ")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ld,
		"-o", dir+"/", "./cmd/airlock", "./cmd/airlock-agent")
	cmd.Dir = c.src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return [2]string{}, fmt.Errorf("go build %s: %v\n%s", arch, err, out)
	}
	return [2]string{filepath.Join(dir, "airlock"), filepath.Join(dir, "airlock-agent")}, nil
}

// docFiles are the documents every archive carries.
func docFiles(src string) ([]file, error) {
	var fs []file
	for _, n := range []string{"LICENSE", "NOTICE", "README.md", "CHANGELOG.md", "api/openapi.yaml"} {
		fs = append(fs, file{name: n, src: filepath.Join(src, n), mode: 0o644})
	}
	mds, err := filepath.Glob(filepath.Join(src, "docs", "*.md"))
	if err != nil || len(mds) == 0 {
		return nil, fmt.Errorf("no docs/*.md under %s (%v)", src, err)
	}
	sort.Strings(mds)
	for _, m := range mds {
		fs = append(fs, file{name: "docs/" + filepath.Base(m), src: m, mode: 0o644})
	}
	return fs, nil
}

// module is one Go module linked into a release binary.
type module struct {
	Path, Version, Sum string
}

// linkedModules reads the modules the binaries link from their own build
// information (what is really in them, not the whole go.mod graph).
func linkedModules(bins [2]string) ([]module, error) {
	seen := map[string]module{}
	for _, b := range bins {
		bi, err := buildinfo.ReadFile(b)
		if err != nil {
			return nil, fmt.Errorf("build info of %s: %w", b, err)
		}
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			seen[d.Path+"@"+d.Version] = module{Path: d.Path, Version: d.Version, Sum: d.Sum}
		}
	}
	mods := make([]module, 0, len(seen))
	for _, m := range seen {
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].Path+"@"+mods[i].Version < mods[j].Path+"@"+mods[j].Version })
	return mods, nil
}

// moduleDirs downloads (or finds in the module cache) mods with one go
// command and returns each one's directory by path@version.
func moduleDirs(mods []module) (map[string]string, error) {
	args := []string{"mod", "download", "-json"}
	for _, m := range mods {
		args = append(args, m.Path+"@"+m.Version)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download: %w", err)
	}
	dirs := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var d struct{ Path, Version, Dir, Error string }
		if err := dec.Decode(&d); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go mod download: %w", err)
		}
		if d.Error != "" || d.Dir == "" {
			return nil, fmt.Errorf("go mod download %s@%s: %s", d.Path, d.Version, d.Error)
		}
		dirs[d.Path+"@"+d.Version] = d.Dir
	}
	return dirs, nil
}

// licenseNames are the files a module's license text is found in.
// (the same list as github.com/airlock-dev/airlock/internal/licenses.Files, which checks them)
var licenseNames = []string{"LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING", "COPYING.md", "LICENSE-MIT", "LICENSE-APACHE", "LICENSE-APACHE-2.0.txt", "LICENSE.MIT", "LICENSE.BSD", "LICENSE.MPL-2.0"}

// thirdPartyLicenses concatenates each linked module's license text (and
// NOTICE, which Apache-2.0 asks to pass on), failing when one has none.
func thirdPartyLicenses(mods []module) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("The airlock binaries link the following Go modules, each under the license below.\n")
	dirs, err := moduleDirs(mods)
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		dir, ok := dirs[m.Path+"@"+m.Version]
		if !ok {
			return nil, fmt.Errorf("go mod download: no %s@%s", m.Path, m.Version)
		}
		found := false
		for _, n := range append(licenseNames, "NOTICE", "NOTICE.md", "NOTICE.txt") {
			text, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				continue
			}
			if !strings.HasPrefix(n, "NOTICE") {
				found = true
			}
			fmt.Fprintf(&b, "\n================================================================\n%s %s: %s\n\n", m.Path, m.Version, n)
			b.Write(bytes.TrimSpace(text))
			b.WriteByte('\n')
		}
		if !found {
			return nil, fmt.Errorf("module %s@%s has no license file (%s)", m.Path, m.Version, strings.Join(licenseNames, ", "))
		}
	}
	return b.Bytes(), nil
}

// file is one entry of an archive: its content from src or data.
type file struct {
	name string
	src  string
	data []byte
	mode int64
}

func (f file) content() ([]byte, error) {
	if f.data != nil {
		return f.data, nil
	}
	return os.ReadFile(f.src)
}

// tarFiles writes files under prefix as a tar stream with fixed owners
// and times; directories are made for every parent.
func tarFiles(w io.Writer, prefix string, files []file, mtime time.Time) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	sorted := append([]file(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, f := range sorted {
		name := f.name
		if prefix != "" {
			name = prefix + "/" + name
		}
		var parents []string
		for d := filepath.Dir(name); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		data, err := f.content()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeArchive writes path, a gzip'd tar of files under prefix/.
func writeArchive(path, prefix string, files []file, mtime time.Time) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	if err := tarFiles(zw, prefix, files, mtime); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// writeSums writes SHA256SUMS (sha256sum's format) over the regular files
// of out, sorted by name; the OCI layout's blobs are named by their
// digests already, so its index.json stands for it.
func writeSums(out string) error {
	var lines []string
	err := filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		if strings.Contains(rel, "-oci/blobs/") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		lines = append(lines, hex.EncodeToString(sum[:])+"  "+filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(lines)
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}
