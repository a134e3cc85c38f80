package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// E2B's snapshots (POST /sandboxes/{id}/snapshots, GET /snapshots, DELETE
// /templates/{id}, and a create naming one as its template) map onto two
// kinds of airlock snapshot:
//
//   - memory: on a tier that declares memory_snapshot, the manager's
//     MemorySnapshot, from which a create forks a copy with the original's
//     processes and memory. Its image lives as long as the snapshotted
//     sandbox (manager.MemorySnapshot).
//   - filesystem: everywhere, an archive of the sandbox's workspace
//     (/home/user) made inside the sandbox and, for a sandbox whose root is
//     an image, an image of its root's changes (manager.Snapshot), both
//     kept by the server until the snapshot is deleted. A create starts the
//     snapshot's template (or that image) and unpacks the archive into the
//     new workspace: files come back, processes do not.
//
// Every snapshot has the filesystem part, so it survives its sandbox as
// E2B's do; while its memory image lives (the sandbox runs) it is of kind
// memory, then filesystem. Snapshots belong to the key that made them: any
// other key is answered as if it did not exist.

// Kinds of snapshot, as reported in a snapshot's "kind".
const (
	SnapshotMemory     = "memory"
	SnapshotFilesystem = "filesystem"
)

// Defaults of the per-key snapshot quota.
const (
	// DefaultSnapshotsPerKey caps the number of snapshots a key keeps.
	DefaultSnapshotsPerKey = 64
	// DefaultSnapshotBytes caps one snapshot's workspace archive.
	DefaultSnapshotBytes = 1 << 30
)

// snapshotTimeout bounds making or unpacking one snapshot's archive.
const snapshotTimeout = 10 * time.Minute

// snapRecord is a snapshot's manifest (SNAPSHOT.json in the snapshot
// directory).
type snapRecord struct {
	ID        string    `json:"id"`
	Owner     string    `json:"owner"`
	Name      string    `json:"name,omitempty"`
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	Profile   string    `json:"profile"`
	Image     string    `json:"image,omitempty"`
	Memory    string    `json:"memory,omitempty"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// snapshotInfo is E2B's SnapshotInfo, with airlock's additions.
type snapshotInfo struct {
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	Kind       string    `json:"kind"`
	SandboxID  string    `json:"sandboxID"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`

	token string // the record's id, the cursor after it
}

// snapshots keeps the E2B snapshots of the server under dir, one
// directory each.
type snapshots struct {
	dir      string
	perKey   int
	maxBytes int64

	mu      sync.Mutex      // guards pending and the quota and name checks
	pending map[string]int  // owner -> snapshots being made
	names   map[string]bool // owner + "/" + name of those being made
}

// reserve checks owner's quota and name (counting the snapshots being
// made) and holds a place until the returned release is called.
func (s *snapshots) reserve(owner, name string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := s.all(owner)
	if err != nil {
		return nil, err
	}
	if n := len(recs) + s.pending[owner]; n >= s.perKey {
		return nil, apiErrorf(http.StatusTooManyRequests, "this key keeps %d snapshots, its quota: delete some (Sandbox.deleteSnapshot) first", n)
	}
	if name != "" {
		if _, taken := s.find(owner, name); taken || s.names[owner+"/"+name] {
			return nil, apiErrorf(http.StatusConflict, "a snapshot named %q exists: delete it first or choose another name", name)
		}
		s.names[owner+"/"+name] = true
	}
	s.pending[owner]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.pending[owner]--; s.pending[owner] == 0 {
			delete(s.pending, owner)
		}
		delete(s.names, owner+"/"+name)
	}, nil
}

// recordPath is where snapshot id's manifest is.
func (s *snapshots) recordPath(id string) string {
	return filepath.Join(s.dir, id, "SNAPSHOT.json")
}

// archivePath is where snapshot id's workspace archive is.
func (s *snapshots) archivePath(id string) string {
	return filepath.Join(s.dir, id, "workspace.tar")
}

// all returns the complete snapshots of owner, oldest first. A directory
// without a readable manifest (a creation that did not finish) is skipped.
func (s *snapshots) all(owner string) ([]snapRecord, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("e2b: snapshots: %w", err)
	}
	var out []snapRecord
	for _, e := range ents {
		if !e.IsDir() || !validSnapshotID(e.Name()) {
			continue
		}
		b, err := os.ReadFile(s.recordPath(e.Name()))
		if err != nil {
			continue
		}
		var rec snapRecord
		if json.Unmarshal(b, &rec) != nil || rec.ID != e.Name() || rec.Owner != owner {
			continue
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// validSnapshotID reports whether id has the form of a snapshot id.
func validSnapshotID(id string) bool {
	rest, ok := strings.CutPrefix(id, "snapshot-")
	if !ok || len(rest) != 16 {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil
}

// find returns owner's snapshot named by ref: its id, or its name with or
// without E2B's ":default" tag. ok is false for anything else, another
// key's snapshots included.
func (s *snapshots) find(owner, ref string) (snapRecord, bool) {
	ref = strings.TrimSuffix(ref, ":default")
	if validSnapshotID(ref) {
		b, err := os.ReadFile(s.recordPath(ref))
		if err != nil {
			return snapRecord{}, false
		}
		var rec snapRecord
		if json.Unmarshal(b, &rec) != nil || rec.ID != ref || rec.Owner != owner {
			return snapRecord{}, false
		}
		return rec, true
	}
	recs, _ := s.all(owner)
	for _, rec := range recs {
		if rec.Name != "" && rec.Name == ref {
			return rec, true
		}
	}
	return snapRecord{}, false
}

// info is rec as E2B lists it; live reports whether its memory image is
// still there.
func (rec *snapRecord) info(live bool) snapshotInfo {
	in := snapshotInfo{SnapshotID: rec.ID, Names: []string{}, Kind: SnapshotFilesystem, SandboxID: rec.SandboxID,
		SizeBytes: rec.SizeBytes, CreatedAt: rec.CreatedAt}
	if rec.Name != "" {
		in.SnapshotID = rec.Name + ":default"
		in.Names = []string{rec.Name + ":default"}
	}
	if live {
		in.Kind = SnapshotMemory
	}
	return in
}

// memoryLive reports whether rec's memory image can still be forked: its
// sandbox runs.
func (h *Handler) memoryLive(ctx context.Context, rec *snapRecord) bool {
	if rec.Memory == "" {
		return false
	}
	in, err := h.m.Get(ctx, rec.Owner, rec.SandboxID)
	return err == nil && in.State == "running"
}

// snapshotName checks a snapshot name given at creation.
func snapshotName(name string) error {
	if len(name) > 128 || validSnapshotID(name) {
		return apiErrorf(http.StatusBadRequest, "snapshot name %q: at most 128 characters, not of the form of a snapshot id", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return apiErrorf(http.StatusBadRequest, "snapshot name %q: use letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}

// createSnapshot serves POST /sandboxes/{id}/snapshots ({name}): a
// filesystem snapshot of the sandbox, plus a memory snapshot where its
// tier declares memory_snapshot. 201 with the SnapshotInfo.
func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	if h.snaps == nil {
		return apiErrorf(http.StatusNotImplemented, "this server keeps no snapshots (it has no state directory)")
	}
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Name != "" {
		if err := snapshotName(req.Name); err != nil {
			return err
		}
	}
	id := r.PathValue("id")
	in, err := h.runningUnpaused(r, id, "snapshotting")
	if err != nil {
		return err
	}
	c := callerOf(r.Context())
	s := h.snaps
	release, err := s.reserve(c.id, req.Name)
	if err != nil {
		return err
	}
	defer release()
	// What the sandbox was made from: a snapshot's sandbox is made from
	// the snapshot's own template.
	tmpl := templateOf(&in)
	var profile, image string
	if base, ok := s.find(c.id, tmpl); ok {
		profile, image, tmpl = base.Profile, base.Image, base.Template
	} else if profile, image, err = h.templateFor(c.id, tmpl); err != nil {
		return err
	}
	b := make([]byte, 8)
	rand.Read(b)
	rec := snapRecord{ID: "snapshot-" + hex.EncodeToString(b), Owner: c.id, Name: req.Name, SandboxID: id,
		Template: tmpl, Profile: profile, Image: image, CreatedAt: time.Now().UTC()}
	dir := filepath.Join(s.dir, rec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("e2b: snapshot directory: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	sb, err := h.m.Lookup(c.id, id)
	if err != nil {
		return notFound(err, id)
	}
	if rec.SizeBytes, err = archiveWorkspace(r.Context(), sb.Agent(), s.archivePath(rec.ID), s.maxBytes); err != nil {
		return err
	}
	if image != "" {
		img, err := h.m.Snapshot(r.Context(), c.id, id, "localhost/airlock/e2b-"+rec.ID+":latest")
		if err != nil {
			return fmt.Errorf("snapshot of the sandbox's root: %w", err)
		}
		rec.Image = img.Name
	}
	if t, terr := tier.Lookup(policy.Runtime(in.Runtime)); terr == nil && t.Caps().MemorySnapshot {
		snap, err := h.m.MemorySnapshot(r.Context(), c.id, id)
		switch {
		case err == nil:
			rec.Memory = snap.ID
		case errors.Is(err, manager.ErrPolicy):
			// This sandbox cannot have one (an image root or network
			// its tier cannot fork): the snapshot is of its files,
			// and reported so.
			h.cfg.Logf("e2b: snapshot %s of %s has no memory image: %v", rec.ID, id, err)
		default:
			return fmt.Errorf("memory snapshot: %w", err)
		}
	}
	j, _ := json.Marshal(rec)
	if err := writeFileAtomic(s.recordPath(rec.ID), j); err != nil {
		return err
	}
	ok = true
	h.m.Audit(r.Context(), c.id, id, "e2b.snapshot", map[string]any{"snapshot": rec.ID, "memory": rec.Memory, "image": rec.Image, "bytes": rec.SizeBytes})
	writeJSON(w, http.StatusCreated, rec.info(rec.Memory != ""))
	return nil
}

// writeFileAtomic writes b to path through a temporary file and a rename.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("e2b: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("e2b: writing %s: %w", path, err)
	}
	return nil
}

// archiveWorkspace writes a tar archive of the sandbox's workspace to
// path, made by tar inside the sandbox (the host never resolves a path the
// sandbox controls), at most max bytes of it. It returns the archive's
// size.
func archiveWorkspace(ctx context.Context, ag *agent.Client, path string, max int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("e2b: snapshot archive: %w", err)
	}
	defer f.Close()
	proc, err := ag.Exec(ctx, agent.ExecRequest{Argv: []string{"tar", "-C", sandboxHome, "-cf", "-", "."}, Tag: "airlock-snapshot"})
	if err != nil {
		return 0, fmt.Errorf("cannot run tar in the sandbox: %w", err)
	}
	defer proc.Close()
	var n int64
	var stderr strings.Builder
	for ev := range proc.Events() {
		switch ev.Type {
		case agent.EventStdout:
			if n += int64(len(ev.Data)); n > max {
				return 0, apiErrorf(http.StatusRequestEntityTooLarge, "the sandbox's workspace archive is larger than the %d bytes a snapshot may have", max)
			}
			if _, err := f.Write(ev.Data); err != nil {
				return 0, fmt.Errorf("e2b: snapshot archive: %w", err)
			}
		case agent.EventStderr:
			if stderr.Len() < 4096 {
				stderr.Write(ev.Data)
			}
		case agent.EventExit:
			// GNU tar's 1 is "a file changed while it was read": the
			// archive is whole, as of some moment of the read.
			if ev.Signal == "" && (ev.ExitCode == 0 || ev.ExitCode == 1) {
				if err := f.Sync(); err != nil {
					return 0, fmt.Errorf("e2b: snapshot archive: %w", err)
				}
				return n, nil
			}
			return 0, fmt.Errorf("tar failed in the sandbox (exit %d %s): %s", ev.ExitCode, ev.Signal, strings.TrimSpace(stderr.String()))
		}
	}
	return 0, fmt.Errorf("tar in the sandbox ended without an exit status: %w", ctx.Err())
}

// restoreWorkspace unpacks the archive at path into the sandbox's
// workspace, with tar inside the sandbox.
func restoreWorkspace(ctx context.Context, ag *agent.Client, path string) error {
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("e2b: snapshot archive: %w", err)
	}
	defer f.Close()
	proc, err := ag.Exec(ctx, agent.ExecRequest{Argv: []string{"tar", "-C", sandboxHome, "-xpf", "-"}, StdinOpen: true, Tag: "airlock-restore"})
	if err != nil {
		return fmt.Errorf("cannot run tar in the sandbox: %w", err)
	}
	defer proc.Close()
	// tar may end as soon as it has read the archive's end marker, before
	// the last write or the close: a failed write ends the feeding, and
	// tar's exit status tells whether the archive was unpacked.
	buf := make([]byte, 1<<20)
	var werr error
	for werr == nil {
		n, rerr := f.Read(buf)
		if n > 0 {
			werr = proc.WriteStdin(ctx, buf[:n], false)
		}
		if rerr == io.EOF {
			if werr == nil {
				// A failed close is tar's to judge too (its exit status below).
				_ = proc.WriteStdin(ctx, nil, true)
			}
			break
		}
		if rerr != nil {
			return fmt.Errorf("e2b: snapshot archive: %w", rerr)
		}
	}
	_, stderr, _, st, err := proc.Collect(ctx, 4096)
	if err != nil {
		return fmt.Errorf("unpacking the snapshot: %w", err)
	}
	if st.Code != 0 || st.Signal != "" {
		return fmt.Errorf("unpacking the snapshot failed in the sandbox (exit %d %s): %s", st.Code, st.Signal, strings.TrimSpace(string(stderr)))
	}

	return nil
}

// createFromSnapshot serves a create whose template is the caller's
// snapshot rec: a fork of its memory image while that lives, else a new
// sandbox of its template (or root image) with its workspace unpacked. A
// sandbox whose workspace cannot be restored is killed: the create fails
// and leaves nothing behind.
//
// A fork has the snapshotted sandbox's environment, network and injected
// headers, so a create that sets any of these (own is false) gets the
// files copy, where they apply, rather than have them ignored.
func (h *Handler) createFromSnapshot(ctx context.Context, rec snapRecord, req manager.CreateRequest, own bool) (manager.Info, string, error) {
	if !own && h.memoryLive(ctx, &rec) {
		// A fork has the original's policy, network and processes (and
		// their environment): only these are its own.
		info, err := h.m.Create(ctx, manager.CreateRequest{Owner: req.Owner, OwnerLimit: req.OwnerLimit,
			Snapshot: rec.Memory, Metadata: req.Metadata, Timeout: req.Timeout})
		if err == nil || !errors.Is(err, manager.ErrNoSnapshot) {
			return info, SnapshotMemory, err
		}
		// The sandbox ended between the check and the fork: its files.
	}
	req.Profile, req.Image = rec.Profile, rec.Image
	info, err := h.m.Create(ctx, req)
	if err != nil {
		return info, "", err
	}
	sb, err := h.m.Lookup(req.Owner, info.ID)
	if err == nil {
		err = restoreWorkspace(ctx, sb.Agent(), h.snaps.archivePath(rec.ID))
	}
	if err != nil {
		if kerr := h.m.Kill(context.WithoutCancel(ctx), req.Owner, info.ID); kerr != nil {
			h.cfg.Logf("e2b: kill of %s after a failed restore: %v", info.ID, kerr)
		}
		return manager.Info{}, "", fmt.Errorf("restoring snapshot %s: %w", rec.ID, err)
	}
	return info, SnapshotFilesystem, nil
}

// listSnapshots serves GET /snapshots (sandboxID, name, limit, nextToken):
// the caller's snapshots, oldest first.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	out := []snapshotInfo{}
	if h.snaps == nil {
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return apiErrorf(http.StatusBadRequest, "limit must be between 1 and 1000")
		}
		limit = n
	}
	recs, err := h.snaps.all(callerOf(r.Context()).id)
	if err != nil {
		return err
	}
	after := q.Get("nextToken")
	for _, rec := range recs {
		if (q.Get("sandboxID") != "" && rec.SandboxID != q.Get("sandboxID")) ||
			(q.Get("name") != "" && rec.Name != strings.TrimSuffix(q.Get("name"), ":default")) {
			continue
		}
		if after != "" {
			if rec.ID == after {
				after = ""
			}
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].token)
			break
		}
		in := rec.info(h.memoryLive(r.Context(), &rec))
		in.token = rec.ID
		out = append(out, in)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate serves DELETE /templates/{id}, which the SDKs use to
// delete a snapshot: the caller's snapshot's archive, root image and
// manifest go (its memory image goes with its sandbox). Anything else,
// another key's snapshot included, is a 404 (the SDK's false).
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("id")
	c := callerOf(r.Context())
	if h.snaps == nil {
		return apiErrorf(http.StatusNotFound, "snapshot '%s' not found", ref)
	}
	s := h.snaps
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.find(c.id, ref)
	if !ok {
		return apiErrorf(http.StatusNotFound, "snapshot '%s' not found (templates are deleted through airlock's own API: DELETE /v1/images/{name})", ref)
	}
	// The manifest goes first: a failure after it leaves files no
	// listing shows, never a listed snapshot without its files.
	if err := os.Remove(s.recordPath(rec.ID)); err != nil {
		return fmt.Errorf("e2b: deleting snapshot %s: %w", rec.ID, err)
	}
	if rec.Image != "" && h.m.Images() != nil {
		if _, err := h.m.Images().As(c.id).Remove(rec.Image); err != nil {
			h.cfg.Logf("e2b: removing the root image %s of snapshot %s: %v", rec.Image, rec.ID, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(s.dir, rec.ID)); err != nil {
		h.cfg.Logf("e2b: removing snapshot %s: %v", rec.ID, err)
	}
	h.m.Audit(r.Context(), c.id, rec.SandboxID, "e2b.snapshot_delete", map[string]any{"snapshot": rec.ID})
	w.WriteHeader(http.StatusNoContent)
	return nil
}
