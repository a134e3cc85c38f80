package e2b

import (
	"strings"
	"testing"
	"time"
)

// TestWriteEventsAsEnvd is E2B's test_watch_iterated: a polling watcher
// (the Python SDK's), a new file written through /files, and the events
// read at once after the write returns: exactly envd's three (create,
// chmod, write), none missing, none extra; then a rewrite of the file
// has its write event there at once too. Repeated, as the race it guards
// against is a matter of timing.
func TestWriteEventsAsEnvd(t *testing.T) {
	e := newEnv(t, true)
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &created)
	id := created.SandboxID
	up := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
		"Content-Type": "application/octet-stream"}
	e.rpc(t, id, "filesystem.Filesystem/MakeDir", `{"path":"/home/user/w"}`, nil)
	var cw createWatcherResponse
	e.rpc(t, id, "filesystem.Filesystem/CreateWatcher", `{"path":"/home/user/w"}`, nil).json(t, &cw)
	events := func() []string {
		var ev struct {
			Events []struct{ Name, Type string }
		}
		e.rpc(t, id, "filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"`+cw.WatcherID+`"}`, nil).json(t, &ev)
		var out []string
		for _, x := range ev.Events {
			out = append(out, strings.TrimPrefix(x.Type, "EVENT_TYPE_")+" "+x.Name)
		}
		return out
	}
	for i := 0; i < 10; i++ {
		name := "f" + string(rune('a'+i)) + ".txt"
		if r := e.do(t, "POST", "/files?path=/home/user/w/"+name, up, []byte("This file will be watched.")); r.status != 200 {
			t.Fatalf("upload: %d %q", r.status, r.body)
		}
		got := strings.Join(events(), ", ")
		if want := "CREATE " + name + ", CHMOD " + name + ", WRITE " + name; got != want {
			t.Fatalf("write %d: events %q, want %q", i, got, want)
		}
		if r := e.do(t, "POST", "/files?path=/home/user/w/"+name, up, []byte("This file has been modified.")); r.status != 200 {
			t.Fatalf("upload: %d %q", r.status, r.body)
		}
		if got := events(); len(got) == 0 || got[len(got)-1] != "WRITE "+name {
			t.Fatalf("rewrite %d: events %q, want them to end with its write", i, got)
		}
		// A rewrite may raise a second write event (the truncation, then
		// the write) that inotify delivers after the first: let it come
		// before the next file, whose events must then be read alone. Only
		// writes of this file may arrive meanwhile.
		for range 5 {
			time.Sleep(100 * time.Millisecond)
			for _, ev := range events() {
				if ev != "WRITE "+name {
					t.Fatalf("rewrite %d: late event %q", i, ev)
				}
			}
		}
	}
}
