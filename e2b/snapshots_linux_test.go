package e2b

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSnapshotQuotaAndTenancy checks the per-key snapshot quota (429),
// the archive cap (413, nothing left on disk), that a snapshot's owner is
// the only key that can use it by id, name or a crafted reference, and
// that a failed restore leaves no sandbox behind.
func TestSnapshotQuotaAndTenancy(t *testing.T) {
	e := newEnvConfig(t, true, Config{SnapshotsPerKey: 2, SnapshotBytes: 256 << 10})
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &created)
	id := created.SandboxID
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
		"Content-Type": "application/octet-stream"}
	if r := e.do(t, "POST", "/files?path=/home/user/a.txt", envd, []byte("a")); r.status != 200 {
		t.Fatalf("upload: %d %q", r.status, r.body)
	}
	// The other key can neither snapshot the sandbox nor see it.
	e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.other, `{}`).apiErr(t, 404)

	var s1, s2 snapshotInfo
	e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.key, `{}`).json(t, &s1)
	e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.key, `{"name":"named"}`).json(t, &s2)
	if s1.Kind != SnapshotFilesystem || s2.SnapshotID != "named:default" {
		t.Fatalf("snapshots: %+v %+v", s1, s2)
	}
	if msg := e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.key, `{}`).apiErr(t, 429); !strings.Contains(msg, "quota") {
		t.Fatalf("quota: %q", msg)
	}
	for _, bad := range []string{`{"name":"../x"}`, `{"name":"snapshot-0123456789abcdef"}`} {
		e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.key, bad).apiErr(t, 400)
	}

	// Another key: its own list is empty; the ids, the name and crafted
	// references are all "not found", for create and delete alike.
	if r := e.api(t, "GET", "/snapshots", e.other, ""); strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("other key lists %q", r.body)
	}
	for _, ref := range []string{s1.SnapshotID, s2.SnapshotID, "named", s1.SnapshotID + ":default"} {
		e.api(t, "POST", "/v2/sandboxes", e.other, `{"templateID":"`+ref+`"}`).apiErr(t, 404)
		e.api(t, "DELETE", "/templates/"+ref, e.other, "").apiErr(t, 404)
	}
	e.api(t, "DELETE", "/templates/..%2F"+s1.SnapshotID, e.key, "").apiErr(t, 404)
	if _, err := os.Stat(filepath.Join(e.h.snaps.dir, s1.SnapshotID, "SNAPSHOT.json")); err != nil {
		t.Fatalf("the snapshot is gone after the other key's attempts: %v", err)
	}

	// Over the archive cap: 413, and no directory is left.
	e.api(t, "DELETE", "/templates/"+s2.SnapshotID, e.key, "").status204(t)
	big := make([]byte, 512<<10)
	if r := e.do(t, "POST", "/files?path=/home/user/big.bin", envd, big); r.status != 200 {
		t.Fatalf("upload: %d %q", r.status, r.body)
	}
	e.api(t, "POST", "/sandboxes/"+id+"/snapshots", e.key, `{}`).apiErr(t, 413)
	ents, _ := os.ReadDir(e.h.snaps.dir)
	if len(ents) != 1 {
		t.Fatalf("snapshot directories after a refused snapshot: %v", ents)
	}

	// A restore that fails (the archive is damaged) kills the sandbox it
	// made: the create fails and nothing is left running.
	if err := os.WriteFile(e.h.snaps.archivePath(s1.SnapshotID), []byte("not a tar archive, not at all; long enough to be read"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.api(t, "DELETE", "/sandboxes/"+id, e.key, "").status204(t)
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"`+s1.SnapshotID+`"}`).apiErr(t, 500)
	if r := e.api(t, "GET", "/sandboxes", e.key, ""); strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("sandboxes left after a failed restore: %s", r.body)
	}
	e.api(t, "DELETE", "/templates/"+s1.SnapshotID, e.key, "").status204(t)
	if ents, _ := os.ReadDir(e.h.snaps.dir); len(ents) != 0 {
		t.Fatalf("left after deleting every snapshot: %v", ents)
	}
}

// status204 checks an empty 204.
func (r reply) status204(t *testing.T) {
	t.Helper()
	if r.status != 204 {
		t.Fatalf("status %d, want 204 (body %q)", r.status, r.body)
	}
}
