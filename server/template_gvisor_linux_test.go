package server_test

import (
	"encoding/json"
	"testing"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestTemplateBuildGVisor: a template whose RUN steps run under gVisor
// ("runtime": "gvisor") makes the same image as one built native: a file
// a RUN step wrote as the image's root and one it chowned to 1000 keep
// those owners, seen from a gvisor and from a native sandbox.
func TestTemplateBuildGVisor(t *testing.T) {
	needRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor unavailable: %v", err)
	}
	reg := it.Registry(t)
	ref := it.Push(t, reg, "api/gvtmpl:1", it.Busybox(t))
	state := stateDir(t)
	s := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "template-gvisor")
	body, _ := json.Marshal(map[string]any{"name": "gv-built:1", "runtime": "gvisor",
		"dockerfile": "FROM " + ref + "\nRUN mkdir -p /opt/app && echo built > /opt/app/root.txt && echo mine > /opt/app/user.txt && chown 1000:1000 /opt/app/user.txt && dmesg | grep -qi gvisor && echo gvisor > /opt/app/kernel\n"})
	if code, v := post(t, s.URL+"/v1/templates", key, string(body)); code != 201 {
		t.Fatalf("build under gvisor: %d %v", code, v)
	}
	bad, _ := json.Marshal(map[string]any{"name": "x:1", "runtime": "kvm", "dockerfile": "FROM " + ref + "\n"})
	if code, v := post(t, s.URL+"/v1/templates", key, string(bad)); code != 422 {
		t.Fatalf("build under an unknown runtime: %d %v", code, v)
	}
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	for _, rt := range []string{"gvisor", "native"} {
		sb, err := c.Create(ctx, client.CreateRequest{Image: "gv-built:1", Runtime: rt, User: "root"})
		if err != nil {
			t.Fatalf("%s sandbox from the gvisor-built template: %v", rt, err)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /opt/app/root.txt /opt/app/kernel; stat -c '%u:%g' /opt/app/root.txt /opt/app/user.txt"}})
		if err != nil || res.Stdout != "built\ngvisor\n0:0\n1000:1000\n" {
			t.Errorf("%s sandbox: %+v %v", rt, res, err)
		}
		c.Kill(ctx, sb.ID)
	}
}
