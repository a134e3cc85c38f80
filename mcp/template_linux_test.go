package mcp_test

import (
	"regexp"
	"strings"
	"testing"

	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/manager"
)

// TestCreateSandboxFromTemplate: create_sandbox with template NAME (a
// template built into the server's image store) gives a sandbox whose
// root is the template's: run_command sees its file and env, and a file
// the host's root lacks; an unknown name is a tool error naming the cause.
func TestCreateSandboxFromTemplate(t *testing.T) {
	needRoot(t)
	st := it.Template(t, "my-template", map[string]string{"greeting.txt": "from the template\n"},
		"ENV APP_NAME=demo", "COPY greeting.txt /opt/app/")
	e := newEnvManager(t, shortDir(t), manager.Config{MaxSandboxes: 20, Images: st}, nil)
	cs := e.connect(t)
	out := mustOK(t, cs, "create_sandbox", map[string]any{"template": "my-template"})
	id := regexp.MustCompile(`sb-[0-9a-f]+`).FindString(out)
	if id == "" || !strings.Contains(out, "template my-template") {
		t.Fatalf("create_sandbox: %q", out)
	}
	got := mustOK(t, cs, "run_command", map[string]any{"sandbox_id": id,
		"command": `cat /opt/app/greeting.txt; echo "app=$APP_NAME"; cat /etc/image-marker`})
	for _, want := range []string{"from the template\n", "app=demo\n", "from the image\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("run_command in the template's sandbox: %q lacks %q", got, want)
		}
	}
	if out := mustFail(t, cs, "create_sandbox", map[string]any{"template": "no-such-template"}); !strings.Contains(out, `image "no-such-template" is not in the server's image store`) {
		t.Errorf("unknown template: %q", out)
	}
}
