package e2b

import (
	"strings"
	"testing"
)

// TestVolumesThroughE2B makes a volume through E2B's /volumes, mounts it
// at /home/user/data in one sandbox, writes a file there, and finds it in
// a second sandbox after the first is killed; another key can neither see,
// mount nor delete it; a volume in use is not deleted.
func TestVolumesThroughE2B(t *testing.T) {
	e := newEnvSetup(t, true, envSetup{volumes: true})
	var v volumeInfo
	if r := e.api(t, "POST", "/volumes", e.key, `{"name":"data"}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	} else {
		r.json(t, &v)
	}
	if v.VolumeID != "data" || v.Name != "data" {
		t.Fatalf("volume: %+v", v)
	}
	e.api(t, "POST", "/volumes", e.key, `{"name":"data"}`).apiErr(t, 409)
	e.api(t, "POST", "/volumes", e.key, `{"name":"../x"}`).apiErr(t, 400)
	if r := e.api(t, "GET", "/volumes", e.key, ""); !strings.Contains(string(r.body), `"volumeID":"data"`) {
		t.Fatalf("list: %s", r.body)
	}
	// Another key.
	if r := e.api(t, "GET", "/volumes", e.other, ""); strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("the other key lists %s", r.body)
	}
	e.api(t, "GET", "/volumes/data", e.other, "").apiErr(t, 404)
	e.api(t, "DELETE", "/volumes/data", e.other, "").apiErr(t, 404)
	mount := `{"templateID":"base","volumeMounts":[{"name":"data","path":"/home/user/data"}]}`
	e.api(t, "POST", "/v2/sandboxes", e.other, mount).apiErr(t, 400)

	var first sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, mount).json(t, &first)
	up := map[string]string{"E2b-Sandbox-Id": first.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(first.SandboxID),
		"Content-Type": "application/octet-stream"}
	if r := e.do(t, "POST", "/files?path=/home/user/data/kept.txt", up, []byte("on the volume")); r.status != 200 {
		t.Fatalf("write: %d %s", r.status, r.body)
	}
	e.api(t, "DELETE", "/volumes/data", e.key, "").apiErr(t, 409)
	e.api(t, "DELETE", "/sandboxes/"+first.SandboxID, e.key, "").status204(t)

	var second sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, mount).json(t, &second)
	get := map[string]string{"E2b-Sandbox-Id": second.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(second.SandboxID)}
	if r := e.do(t, "GET", "/files?path=/home/user/data/kept.txt", get, nil); r.status != 200 || string(r.body) != "on the volume" {
		t.Fatalf("read in the second sandbox: %d %q", r.status, r.body)
	}
	e.api(t, "DELETE", "/sandboxes/"+second.SandboxID, e.key, "").status204(t)
	e.api(t, "DELETE", "/volumes/data", e.key, "").status204(t)
	e.api(t, "GET", "/volumes/data", e.key, "").apiErr(t, 404)
}
