package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// writeDeb writes airlock_VERSION_ARCH.deb: the two binaries in /usr/bin,
// the systemd unit (not enabled: the operator enables it), the documents
// and the licenses, every file dated at the commit.
func writeDeb(out string, c config, arch string, bins [2]string, third []byte) error {
	thirdPath := filepath.Join(filepath.Dir(bins[0]), "THIRD_PARTY_LICENSES")
	if err := os.WriteFile(thirdPath, third, 0o644); err != nil {
		return err
	}
	fi := func(mode os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: c.date}
	}
	doc := "/usr/share/doc/airlock/"
	contents := files.Contents{
		{Source: bins[0], Destination: "/usr/bin/airlock", FileInfo: fi(0o755)},
		{Source: bins[1], Destination: "/usr/bin/airlock-agent", FileInfo: fi(0o755)},
		{Source: filepath.Join(c.src, "deploy/systemd/airlock.service"), Destination: "/usr/lib/systemd/system/airlock.service", FileInfo: fi(0o644)},
		{Source: filepath.Join(c.src, "LICENSE"), Destination: doc + "LICENSE", FileInfo: fi(0o644)},
		{Source: filepath.Join(c.src, "NOTICE"), Destination: doc + "NOTICE", FileInfo: fi(0o644)},
		{Source: filepath.Join(c.src, "README.md"), Destination: doc + "README.md", FileInfo: fi(0o644)},
		{Source: filepath.Join(c.src, "CHANGELOG.md"), Destination: doc + "CHANGELOG.md", FileInfo: fi(0o644)},
		{Source: thirdPath, Destination: doc + "THIRD_PARTY_LICENSES", FileInfo: fi(0o644)},
	}
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:        "airlock",
		Arch:        arch,
		Platform:    "linux",
		Version:     c.version,
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "airlock maintainers <airlock@localhost>",
		Description: "Self-hosted sandbox for code that AI agents write and run\nOne static binary: Linux namespaces, seccomp, Landlock and cgroups, with\ngVisor, WebAssembly and microVM runtimes, an HTTP API, E2B and MCP.",
		License:     "Apache-2.0",
		MTime:       c.date,
		Overridables: nfpm.Overridables{
			Contents:   contents,
			Recommends: []string{"python3"},
			Suggests:   []string{"qemu-system-x86"},
		},
	})
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := deb.Default.Package(info, &buf); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, fmt.Sprintf("airlock_%s_%s.deb", c.version, arch)), buf.Bytes(), 0o644)
}
