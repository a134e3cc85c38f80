package release_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// testVersion is the version the test's release carries.
const testVersion = "9.8.7-test"

// dist is one run of scripts/release.sh for amd64 (the CI machine's;
// arm64 is cross-compiled the same way by a real release).
type dist struct {
	dir, commit, date string
}

var (
	// removeAtEnd is the shared release's directory, removed by TestMain.
	removeAtEnd string
	distOnce    sync.Once
	distA       dist
	distErr     error
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// release runs scripts/release.sh into a fresh directory under /var/lib
// (not /tmp or /var/tmp: the unit's PrivateTmp hides them from the
// service); the caller removes its parent.
func release(t *testing.T, root string) string {
	t.Helper()
	out, err := os.MkdirTemp("/var/lib", "airlock-release-test-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts/release.sh"), testVersion)
	cmd.Env = append(os.Environ(), "ARCH=amd64", "OUT="+filepath.Join(out, "dist"), "RELEASE_ALLOW_DIRTY=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, b)
	}
	return filepath.Join(out, "dist")
}

// getDist builds the release once per test binary.
func getDist(t *testing.T) dist {
	t.Helper()
	root := repoRoot(t)
	distOnce.Do(func() {
		head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
		if err != nil {
			distErr = err
			return
		}
		distA.commit = strings.TrimSpace(string(head))
		if st, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); len(st) > 0 {
			distA.commit += "-dirty"
		}
		d, err := exec.Command("git", "-C", root, "show", "-s", "--format=%cI", "HEAD").Output()
		if err != nil {
			distErr = err
			return
		}
		when, err := time.Parse(time.RFC3339, strings.TrimSpace(string(d)))
		if err != nil {
			distErr = err
			return
		}
		distA.date = when.UTC().Format(time.RFC3339)
		distA.dir = release(t, root)
		removeAtEnd = filepath.Dir(distA.dir)
	})
	if distErr != nil {
		t.Fatal(distErr)
	}
	if distA.dir == "" {
		t.Fatal("the release build failed in an earlier test")
	}
	return distA
}

// TestReleaseReproducible: two runs of scripts/release.sh on the same
// commit give the same bytes (the archive, .deb, SBOM and image), and the
// checksums file checks.
func TestReleaseReproducible(t *testing.T) {
	testserver.NeedRoot(t)
	d := getDist(t)
	again := release(t, repoRoot(t))
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(again)) })
	a, err := os.ReadFile(filepath.Join(d.dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(again, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two release builds differ:\n%s\n---\n%s", a, b)
	}
	for _, want := range []string{"airlock-" + testVersion + "-linux-amd64.tar.gz", "airlock_" + testVersion + "_amd64.deb",
		"airlock-" + testVersion + "-linux-amd64.cdx.json", "airlock-" + testVersion + "-oci/index.json"} {
		if !bytes.Contains(a, []byte("  "+want+"\n")) {
			t.Errorf("SHA256SUMS lacks %s:\n%s", want, a)
		}
	}
	cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	cmd.Dir = d.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum --check: %v\n%s", err, out)
	}
}

// TestReleaseArchive: the archive holds both binaries (static: no ELF
// interpreter), the docs, LICENSE, NOTICE, the unit and every linked
// module's license; the SBOM lists the linked modules.
func TestReleaseArchive(t *testing.T) {
	testserver.NeedRoot(t)
	d := getDist(t)
	base := "airlock-" + testVersion + "-linux-amd64"
	f, err := os.Open(filepath.Join(d.dir, base+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := t.TempDir()
	x := exec.Command("tar", "-xzf", "-", "-C", out)
	x.Stdin = f
	if b, err := x.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	for _, n := range []string{"airlock", "airlock-agent", "LICENSE", "NOTICE", "README.md", "CHANGELOG.md", "airlock.service",
		"THIRD_PARTY_LICENSES", "docs/SECURITY.md", "api/openapi.yaml"} {
		if _, err := os.Stat(filepath.Join(out, base, n)); err != nil {
			t.Errorf("archive: %v", err)
		}
	}
	for _, n := range []string{"airlock", "airlock-agent"} {
		ef, err := elf.Open(filepath.Join(out, base, n))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked (%v)", n, p.Type)
			}
		}
		ef.Close()
	}
	third, _ := os.ReadFile(filepath.Join(out, base, "THIRD_PARTY_LICENSES"))
	var bom struct {
		BOMFormat  string `json:"bomFormat"`
		Components []struct {
			Name, Version, Purl string
		} `json:"components"`
	}
	sb, err := os.ReadFile(filepath.Join(d.dir, base+".cdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(sb, &bom); err != nil || bom.BOMFormat != "CycloneDX" || len(bom.Components) < 10 {
		t.Fatalf("SBOM: %v format %q, %d components", err, bom.BOMFormat, len(bom.Components))
	}
	for _, c := range bom.Components {
		if !strings.HasPrefix(c.Purl, "pkg:golang/"+c.Name+"@") {
			t.Errorf("SBOM component %s: purl %q", c.Name, c.Purl)
		}
		if !bytes.Contains(third, []byte(c.Name+" "+c.Version+": ")) {
			t.Errorf("THIRD_PARTY_LICENSES has no license of %s %s", c.Name, c.Version)
		}
	}
}

// install extracts the .deb into a fresh root (dpkg -x: no maintainer
// scripts run, as in a sandboxed install) and returns it.
func install(t *testing.T, d dist) string {
	t.Helper()
	deb := filepath.Join(d.dir, "airlock_"+testVersion+"_amd64.deb")
	for field, want := range map[string]string{"Package": "airlock", "Architecture": "amd64", "Version": "9.8.7~test"} {
		got, err := exec.Command("dpkg-deb", "--field", deb, field).Output()
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("dpkg-deb --field %s: %q %v, want %q", field, got, err, want)
		}
	}
	root, err := os.MkdirTemp(filepath.Dir(d.dir), "root-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o755)
	if out, err := exec.Command("dpkg", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -x: %v\n%s", err, out)
	}
	return root
}

// TestDebInstalled: the installed airlock names the release's version,
// commit and date, and its doctor passes on this host.
func TestDebInstalled(t *testing.T) {
	testserver.NeedRoot(t)
	d := getDist(t)
	root := install(t, d)
	bin := filepath.Join(root, "usr/bin/airlock")
	out, err := exec.Command(bin, "version").CombinedOutput()
	want := "airlock " + testVersion + " (commit " + d.commit[:12]
	if err != nil || !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), d.date) {
		t.Errorf("installed airlock version: %q %v, want %q... %s", out, err, want, d.date)
	}
	doc := exec.Command(bin, "doctor")
	if out, err := doc.CombinedOutput(); err != nil {
		t.Errorf("installed airlock doctor: %v\n%s", err, out)
	}
	for _, n := range []string{"usr/bin/airlock-agent", "usr/lib/systemd/system/airlock.service", "usr/share/doc/airlock/LICENSE",
		"usr/share/doc/airlock/NOTICE", "usr/share/doc/airlock/THIRD_PARTY_LICENSES"} {
		if _, err := os.Stat(filepath.Join(root, n)); err != nil {
			t.Errorf("package: %v", err)
		}
	}
}

// execStart reads the unit's ExecStart command line.
func execStart(t *testing.T, unit string) []string {
	t.Helper()
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("%s has no ExecStart", unit)
	return nil
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// TestSystemdUnit: systemd-analyze verifies the installed unit, and the
// unit's own command line, run by the installed binary under the unit's
// mount hardening (ProtectSystem=full, ProtectHome=read-only, PrivateTmp:
// rebuilt here with a mount namespace, as systemd would), serves sandboxes
// that run, write their /tmp and read the host's /usr.
func TestSystemdUnit(t *testing.T) {
	testserver.NeedRoot(t)
	d := getDist(t)
	root := install(t, d)
	unit := filepath.Join(root, "usr/lib/systemd/system/airlock.service")
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// verify checks that ExecStart's binary exists: point it at the
		// installed one.
		b, _ := os.ReadFile(unit)
		local := filepath.Join(t.TempDir(), "airlock.service")
		os.WriteFile(local, bytes.ReplaceAll(b, []byte("ExecStart=/usr/bin/airlock"), []byte("ExecStart="+filepath.Join(root, "usr/bin/airlock"))), 0o644)
		if out, err := exec.Command("systemd-analyze", "verify", local).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("systemd-analyze not installed: the unit is only parsed")
	}

	argv := execStart(t, unit)
	if argv[0] != "/usr/bin/airlock" || argv[1] != "serve" {
		t.Fatalf("ExecStart %q", argv)
	}
	// The unit's flags, with a free port and a state directory of the
	// test's own in place of 127.0.0.1:7070 and /var/lib/airlock.
	state, err := os.MkdirTemp("/var/lib", "airlock-unit-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	args := append([]string(nil), argv[1:]...)
	for i := range args {
		switch {
		case i > 0 && args[i-1] == "--listen":
			args[i] = "127.0.0.1:0"
		case i > 0 && args[i-1] == "--state-dir":
			args[i] = state
		}
	}
	// systemd's ProtectSystem=full, ProtectHome=read-only and PrivateTmp,
	// in a private mount namespace; a write to /etc must fail in it.
	script := `set -e
for d in /usr /boot /efi /etc /home /root /run/user; do
	[ -d "$d" ] || continue
	mount --bind "$d" "$d"
	mount -o remount,bind,ro "$d"
done
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
if touch /etc/.airlock-unit-probe 2>/dev/null; then rm -f /etc/.airlock-unit-probe; echo "/etc is writable: the hardening is not in place" >&2; exit 99; fi
exec "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh",
		filepath.Join(root, "usr/bin/airlock")}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
		}
	})
	var url string
	select {
	case url = <-urlc:
	case err := <-done:
		t.Fatalf("the unit's command ended before listening: %v\n%s", err, log.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("the unit's command did not listen in 3 minutes\n%s", log.String())
	}

	resp, err := http.Get(url + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Version, Commit string
		BuildDate       string `json:"build_date"`
		AgentBinary     string `json:"agent_binary"`
		Enforced        []struct{ Name, State, Detail string }
	}
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	// Every isolation layer the server enforces outside the unit holds
	// inside it (a read-only /sys/fs/cgroup, as ProtectControlGroups would
	// make it, shows here as a degraded cgroup layer).
	layers := 0
	for _, l := range info.Enforced {
		if l.Name == "cgroup" || l.Name == "seccomp" || l.Name == "userns" || l.Name == "mountns" || l.Name == "landlock" {
			layers++
			if l.State != "ok" {
				t.Errorf("under the unit's hardening, layer %s is %s: %s", l.Name, l.State, l.Detail)
			}
		}
	}
	if layers == 0 {
		t.Errorf("/v1/info lists no isolation layers: %+v", info.Enforced)
	}
	if info.Version != testVersion || info.Commit != d.commit || info.BuildDate != d.date {
		t.Errorf("/v1/info %+v, want version %s commit %s build_date %s", info, testVersion, d.commit, d.date)
	}
	if want := filepath.Join(root, "usr/bin/airlock-agent"); info.AgentBinary != want {
		t.Errorf("/v1/info agent_binary %q, want the packaged %s (same release stamp)", info.AgentBinary, want)
	}
	code, sb := testserver.PostJSON(t, url+"/v1/sandboxes", "", `{}`)
	if code != 201 {
		t.Fatalf("create under the unit's hardening: %d %v\n%s", code, sb, log.String())
	}
	id, _ := sb["id"].(string)
	code, res := testserver.PostJSON(t, url+"/v1/sandboxes/"+id+"/exec", "",
		`{"argv":["sh","-c","echo hi > /tmp/x && cat /tmp/x && test -x /usr/bin/python3 && echo usr"]}`)
	if code != 200 || res["status"] != "ok" || res["stdout"] != "hi\nusr\n" {
		t.Errorf("exec under the unit's hardening: %d %v\n%s", code, res, log.String())
	}
}

// TestOCIImage: the image layout holds a linux/amd64 image whose
// entrypoint is /airlock with the API as its default command; its layer,
// unpacked as a bundle's root, runs under crun (the entrypoint with
// "version" instead of serve).
func TestOCIImage(t *testing.T) {
	testserver.NeedRoot(t)
	d := getDist(t)
	p, err := layout.FromPath(filepath.Join(d.dir, "airlock-"+testVersion+"-oci"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != testVersion {
		t.Fatalf("index.json: %+v %v", tm, err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != "amd64" {
		t.Fatalf("image index: %+v %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/airlock" || len(cf.Config.Cmd) == 0 || cf.Config.Cmd[0] != "serve" ||
		cf.Architecture != "amd64" || cf.Config.Labels["org.opencontainers.image.revision"] != d.commit {
		t.Errorf("image config: %+v", cf)
	}
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := unpack(img, rootfs); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"airlock", "airlock-agent", "usr/share/doc/airlock/LICENSE"} {
		if _, err := os.Stat(filepath.Join(rootfs, n)); err != nil {
			t.Errorf("image layer: %v", err)
		}
	}
	args := append(append([]string(nil), cf.Config.Entrypoint...), "version")
	want := "airlock " + testVersion + " (commit " + d.commit[:12]
	if out, ok := runCrun(t, bundle, args, cf.Config.Env); ok {
		if !strings.HasPrefix(out, want) {
			t.Errorf("crun run of the image's entrypoint: %q, want %q...", out, want)
		}
		return
	}
	// The image's root alone, chrooted (what crun would do, without its
	// cgroup and namespaces).
	cmd := exec.Command("chroot", append([]string{rootfs}, args...)...)
	cmd.Env = cf.Config.Env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("chroot into the image's root, its entrypoint: %v %q, want %q...", err, out, want)
	}
}

// runCrun runs args in the bundle's rootfs with crun and returns the
// output; ok is false when crun is missing or cannot run a container on
// this host (crun refuses a hybrid cgroup v1/v2 layout, as on the
// development machine), which it logs.
func runCrun(t *testing.T, bundle string, args, env []string) (string, bool) {
	t.Helper()
	if _, err := exec.LookPath("crun"); err != nil {
		t.Log("crun not installed: the entrypoint runs chrooted instead")
		return "", false
	}
	if out, err := exec.Command("crun", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("crun spec: %v %s", err, out)
	}
	specPath := filepath.Join(bundle, "config.json")
	var spec map[string]any
	b, _ := os.ReadFile(specPath)
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = args
	proc["env"] = env
	b, _ = json.Marshal(spec)
	if err := os.WriteFile(specPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "airlock-image-test-" + filepath.Base(bundle)
	out, err := exec.Command("crun", "run", "--bundle", bundle, id).CombinedOutput()
	exec.Command("crun", "delete", "--force", id).Run()
	if err != nil && strings.Contains(string(out), "cgroups in hybrid mode not supported") {
		t.Logf("crun cannot run a container on this host (%s): the entrypoint runs chrooted instead", bytes.TrimSpace(out))
		return "", false
	}
	if err != nil {
		t.Fatalf("crun run: %v\n%s", err, out)
	}
	return string(out), true
}

// unpack writes img's layers into dir (regular files and directories:
// all the release image holds).
func unpack(img v1.Image, dir string) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			dst := filepath.Join(dir, filepath.Clean("/"+h.Name))
			switch h.Typeflag {
			case tar.TypeDir:
				if err := os.MkdirAll(dst, 0o755); err != nil {
					return err
				}
			case tar.TypeReg:
				os.MkdirAll(filepath.Dir(dst), 0o755)
				f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode))
				if err != nil {
					return err
				}
				if _, err := io.Copy(f, tr); err != nil {
					f.Close()
					return err
				}
				f.Close()
			}
		}
		rc.Close()
	}
	return nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if removeAtEnd != "" {
		os.RemoveAll(removeAtEnd)
	}
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for the server's stderr copier and
// the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
