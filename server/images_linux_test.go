package server_test

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestImagesAPI drives /v1/images against a registry on 127.0.0.1: pull
// from an allowed registry, refuse one that is not allowed, list, inspect
// by name and digest, refuse a hostile image with 422, remove.
func TestImagesAPI(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	other := it.Registry(t)
	good := it.Push(t, reg, "api/good:v1", it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/image-marker", Type: tar.TypeReg, Data: "m"})))
	bad := it.Push(t, reg, "api/bad:v1", it.Image(t, it.TarLayer(t, it.Entry{Name: "../../escape", Type: tar.TypeReg, Data: "x"})))
	elsewhere := it.Push(t, other, "api/good:v1", it.Image(t, it.TarLayer(t, it.Entry{Name: "x", Type: tar.TypeReg})))

	state := stateDir(t)
	s := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "images")
	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s %s: %d %q", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, v
	}
	errMsg := func(v map[string]any) string {
		e, _ := v["error"].(map[string]any)
		m, _ := e["message"].(string)
		return m
	}

	code, v := call("POST", "/v1/images", `{"ref":"`+good+`"}`)
	if code != 200 || v["name"] != good {
		t.Fatalf("pull: %d %v", code, v)
	}
	digest, _ := v["digest"].(string)
	if code, v := call("POST", "/v1/images", `{"ref":"`+elsewhere+`"}`); code != 403 || !strings.Contains(errMsg(v), "--image-registry") {
		t.Fatalf("pull from a registry not allowed: %d %v", code, v)
	}
	if code, v := call("POST", "/v1/images", `{"ref":"Not A Ref"}`); code != 400 {
		t.Fatalf("bad ref: %d %v", code, v)
	}
	if code, v := call("POST", "/v1/images", `{"ref":"`+bad+`"}`); code != 422 || !strings.Contains(errMsg(v), "would leave the layer") {
		t.Fatalf("hostile image: %d %v", code, v)
	}
	code, v = call("GET", "/v1/images", "")
	imgs, _ := v["images"].([]any)
	if code != 200 || len(imgs) != 1 {
		t.Fatalf("list: %d %v", code, v)
	}
	if code, v := call("GET", "/v1/images/"+good, ""); code != 200 || v["digest"] != digest {
		t.Fatalf("get by name: %d %v", code, v)
	}
	if code, v := call("GET", "/v1/images/"+url.PathEscape(digest), ""); code != 200 || v["name"] != good {
		t.Fatalf("get by digest: %d %v", code, v)
	}
	if code, v := call("DELETE", "/v1/images/"+good, ""); code != 200 || v["digest"] != digest {
		t.Fatalf("delete: %d %v", code, v)
	}
	if code, v := call("GET", "/v1/images/"+good, ""); code != 404 {
		t.Fatalf("get after delete: %d %v", code, v)
	}
	if code, v := call("DELETE", "/v1/images/"+good, ""); code != 404 {
		t.Fatalf("delete twice: %d %v", code, v)
	}
}

// TestImageSandbox: POST /v1/sandboxes {"image"} gives a sandbox whose root
// is the image, writable; removing the image while the sandbox lives keeps
// its layers (leased); the store's images and layers are unchanged by the
// sandbox's writes, and its root goes with it.
func TestImageSandbox(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "api/busybox:1", it.Busybox(t))
	state := stateDir(t)
	s := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "image-sandbox")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if _, err := c.Create(ctx, client.CreateRequest{Image: ref}); err == nil || !strings.Contains(err.Error(), "not in the server's image store") {
		t.Fatalf("create from an image not pulled: %v", err)
	}
	req, _ := http.NewRequest("POST", s.URL+"/v1/images", strings.NewReader(`{"ref":"`+ref+`"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("pull: %v %v", resp, err)
	}
	resp.Body.Close()
	sig := func() string {
		return it.TreeSig(t, filepath.Join(state, "images", "oci")) + it.TreeSig(t, filepath.Join(state, "images", "layers"))
	}
	before := sig()

	sb, err := c.Create(ctx, client.CreateRequest{Image: ref, Env: map[string]string{"FROM_REQUEST": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	script := "cat /etc/image-marker; echo x > /usr/local/y && cat /usr/local/y; id -u; echo $IMAGE $FROM_REQUEST; test ! -e /usr/bin/python3 && echo no-host-usr"
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "from the image\nx\n0\ntest yes\nno-host-usr\n"; res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("exec: %+v, want %q", res, want)
	}
	if after := sig(); after != before {
		t.Fatalf("the sandbox's writes changed the image store:\n%s\n%s", before, after)
	}
	// Snapshot: a new image of the base plus the sandbox's changes (a
	// new file, a removed one); a sandbox made from it sees both.
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "rm /etc/image-marker && mkdir -p /opt/pkg && echo v1 > /opt/pkg/VERSION"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	code, v := post(t, s.URL+"/v1/sandboxes/"+sb.ID+"/snapshot", key, `{"name":"snap/test:1"}`)
	if code != 201 || v["name"] != "index.docker.io/snap/test:1" {
		t.Fatalf("snapshot: %d %v", code, v)
	}
	sb2, err := c.Create(ctx, client.CreateRequest{Image: "snap/test:1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb2.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /usr/local/y /opt/pkg/VERSION; test ! -e /etc/image-marker && echo marker-gone; stat -c %u /opt/pkg/VERSION"}})
	if err != nil || res.Stdout != "x\nv1\nmarker-gone\n0\n" {
		t.Fatalf("sandbox from the snapshot: %+v %v", res, err)
	}
	if code, v := post(t, s.URL+"/v1/sandboxes/sb-0000000000000000/snapshot", key, `{}`); code != 404 {
		t.Fatalf("snapshot of no sandbox: %d %v", code, v)
	}
	plain, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if code, v := post(t, s.URL+"/v1/sandboxes/"+plain.ID+"/snapshot", key, `{}`); code != 400 {
		t.Fatalf("snapshot of a sandbox without an image: %d %v", code, v)
	}
	// Remove the image while the sandbox runs: its layers are leased.
	req, _ = http.NewRequest("DELETE", s.URL+"/v1/images/"+ref, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete image: %v %v", resp, err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /usr/local/y; /bin/busybox echo layers-still-there"}})
	if err != nil || res.Stdout != "x\nlayers-still-there\n" {
		t.Fatalf("exec after removing the image: %+v %v", res, err)
	}
	// The sandbox's writes live on its own capped filesystem, a file in
	// its directory on disk.
	if fi, err := os.Stat(filepath.Join(state, "sandboxes", sb.ID, "root", "disk.img")); err != nil || fi.Size() < 4<<20 {
		t.Fatalf("upper filesystem image: %v %v", fi, err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox root left after kill: %v", err)
	}
	for _, id := range []string{sb2.ID, plain.ID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// The upper filesystems' loop devices free themselves. The server's
	// ready disks (diskpool, not yet taken: their files still linked) stay.
	eventually(t, 2*time.Minute, "loop devices of the sandboxes detached", func() bool {
		backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, b := range backing {
			f, _ := os.ReadFile(b)
			name := strings.TrimSpace(string(f))
			ready := strings.HasPrefix(name, filepath.Join(state, "diskpool")+"/") && !strings.HasSuffix(name, "(deleted)")
			if strings.HasPrefix(name, state) && !ready {
				return false
			}
		}
		return true
	})
}

// post sends an authenticated JSON POST and decodes the JSON answer.
func post(t *testing.T, url, key, body string) (int, map[string]any) {
	t.Helper()
	return testserver.PostJSON(t, url, key, body)
}

// TestVolumes: a named volume written by one sandbox is read by another
// (another host id range) after a server restart, with the same owners;
// it is capped at its size; it cannot be deleted while a sandbox uses it.
func TestVolumes(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	s := startServer(t, state)
	key := newKey(t, state, "volumes")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if code, v := post(t, s.URL+"/v1/volumes", key, `{"name":"data","size_bytes":8388608}`); code != 201 || v["name"] != "data" {
		t.Fatalf("create volume: %d %v", code, v)
	}
	if code, v := post(t, s.URL+"/v1/volumes", key, `{"name":"data","size_bytes":8388608}`); code != 409 {
		t.Fatalf("create twice: %d %v", code, v)
	}
	if code, v := post(t, s.URL+"/v1/volumes", key, `{"name":"../x","size_bytes":8388608}`); code != 400 {
		t.Fatalf("bad name: %d %v", code, v)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Volumes: []client.VolumeRef{{Name: "data", Path: "/proc/x"}}}); err == nil {
		t.Fatal("volume under /proc accepted")
	}
	a, err := c.Create(ctx, client.CreateRequest{Volumes: []client.VolumeRef{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, a.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo kept > /data/f && id -u"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("write: %+v %v", res, err)
	}
	req, _ := http.NewRequest("DELETE", s.URL+"/v1/volumes/data", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 409 {
		t.Fatalf("delete a volume in use: %v %v", resp, err)
	}
	if err := c.Kill(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.stop(t)
	s = startServer(t, state)
	c = client.New(s.URL, key)
	b, err := c.Create(ctx, client.CreateRequest{Volumes: []client.VolumeRef{{Name: "data", Path: "/workspace/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, b.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"cat /workspace/data/f; stat -c %u /workspace/data/f; echo more >> /workspace/data/f && echo appended; dd if=/dev/zero of=/workspace/data/big bs=1M count=20 2>&1 | grep -o 'No space left on device'"}})
	if err != nil || res.Stdout != "kept\n1000\nappended\nNo space left on device\n" {
		t.Fatalf("sandbox b after a restart: %+v %v", res, err)
	}
	if err := c.Kill(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest("DELETE", s.URL+"/v1/volumes/data", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	if _, err := os.Stat(filepath.Join(state, "volumes", "data")); !os.IsNotExist(err) {
		t.Fatalf("volume data left: %v", err)
	}
}

// TestTemplatesAPI: POST /v1/templates builds a Dockerfile with a context
// sent in the request (FROM pulled from an allowed registry only), caches
// its steps, and sandboxes are created from the result.
func TestTemplatesAPI(t *testing.T) {
	needRoot(t)
	reg, other := it.Registry(t), it.Registry(t)
	ref := it.Push(t, reg, "api/tmpl:1", it.Busybox(t))
	elsewhere := it.Push(t, other, "api/tmpl:1", it.Busybox(t))
	state := stateDir(t)
	s := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "templates")
	body := func(from string) string {
		b, _ := json.Marshal(map[string]any{"name": "mine:1", "dockerfile": "FROM " + from + "\nCOPY app.txt /app/\nRUN cat /app/app.txt > /app/copy.txt\n",
			"files": map[string]string{"app.txt": "aGVsbG8K"}})
		return string(b)
	}
	if code, v := post(t, s.URL+"/v1/templates", key, body(elsewhere)); code != 403 {
		t.Fatalf("FROM a registry not allowed: %d %v", code, v)
	}
	code, v := post(t, s.URL+"/v1/templates", key, body(ref))
	if code != 201 || v["cached"] != 0.0 || v["steps"] != 3.0 {
		t.Fatalf("build: %d %v", code, v)
	}
	code, v = post(t, s.URL+"/v1/templates", key, body(ref))
	if code != 201 || v["cached"] != 2.0 {
		t.Fatalf("rebuild: %d %v", code, v)
	}
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Image: "mine:1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /app/copy.txt"}})
	if err != nil || res.Stdout != "hello\n" {
		t.Fatalf("sandbox from the template: %+v %v", res, err)
	}
	if code, v := post(t, s.URL+"/v1/templates", key, `{"name":"x:1","dockerfile":"FROM `+ref+`","files":{"../evil":"eA=="}}`); code != 400 {
		t.Fatalf("context path escaping: %d %v", code, v)
	}
}
