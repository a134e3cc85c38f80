package server_test

import (
	"bufio"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// The statuses api/openapi.yaml lists, by "METHOD /path/{template}".
var (
	openapiOnce sync.Once
	openapiOps  map[string]map[int]bool
	openapiErr  error
)

var (
	oaPath   = regexp.MustCompile(`^  (/\S*):\s*$`)
	oaMethod = regexp.MustCompile(`^    (get|post|put|delete|patch):`)
	oaStatus = regexp.MustCompile(`"([1-5][0-9][0-9])":`)
)

// loadOpenAPI reads the operations and their response statuses from
// api/openapi.yaml (its paths section is regular: a path at indent 2, a
// method at indent 4, statuses quoted).
func loadOpenAPI() (map[string]map[int]bool, error) {
	openapiOnce.Do(func() {
		f, err := os.Open("../api/openapi.yaml")
		if err != nil {
			openapiErr = err
			return
		}
		defer f.Close()
		openapiOps = map[string]map[int]bool{}
		var path, op string
		inPaths := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if line == "paths:" {
				inPaths = true
				continue
			}
			if !inPaths {
				continue
			}
			if m := oaPath.FindStringSubmatch(line); m != nil {
				path, op = m[1], ""
				continue
			}
			if m := oaMethod.FindStringSubmatch(line); m != nil && path != "" {
				op = strings.ToUpper(m[1]) + " " + path
				openapiOps[op] = map[int]bool{}
			}
			if op == "" {
				continue
			}
			for _, m := range oaStatus.FindAllStringSubmatch(line, -1) {
				n, _ := strconv.Atoi(m[1])
				openapiOps[op][n] = true
			}
		}
		openapiErr = sc.Err()
	})
	return openapiOps, openapiErr
}

// operation returns the documented operation a request goes to, or "".
func operation(ops map[string]map[int]bool, method, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	segs := strings.Split(u.Path, "/")
	for op := range ops {
		m, p, _ := strings.Cut(op, " ")
		if m != method {
			continue
		}
		tsegs := strings.Split(p, "/")
		if len(tsegs) != len(segs) {
			continue
		}
		match := true
		for i, ts := range tsegs {
			if !strings.HasPrefix(ts, "{") && ts != segs[i] {
				match = false
				break
			}
		}
		if match {
			return op
		}
	}
	return ""
}

// checkDocumented fails t if api/openapi.yaml describes this request's
// operation but not the status it got.
func checkDocumented(t testing.TB, method, rawURL string, status int) {
	t.Helper()
	ops, err := loadOpenAPI()
	if err != nil {
		t.Fatalf("read api/openapi.yaml: %v", err)
	}
	if op := operation(ops, method, rawURL); op != "" && !ops[op][status] {
		t.Errorf("api/openapi.yaml does not list status %d for %s (%s)", status, op, rawURL)
	}
}

// TestE2EOpenAPIListsEveryStatus walks every operation api/openapi.yaml
// describes with the requests that reach its error paths (no key, unknown
// sandbox, ended sandbox, empty, null and unknown-field bodies, unknown
// query parameters, a missing file or process) and checks that each
// status it gets is listed for that operation.
func TestE2EOpenAPIListsEveryStatus(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "openapi")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	ops, err := loadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) < 30 {
		t.Fatalf("read only %d operations from api/openapi.yaml", len(ops))
	}
	running, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, running.ID, "f.txt", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(ops))
	for op := range ops {
		names = append(names, op)
	}
	sort.Strings(names)
	seen := map[string]map[int]bool{}
	for _, op := range names {
		method, tmpl, _ := strings.Cut(op, " ")
		concrete := func(id, file string) string {
			p := strings.NewReplacer("{id}", id, "{pid}", "4242", "{cid}", "nope", "{execution_id}", "nope").Replace(tmpl)
			if strings.Contains(tmpl, "/files") {
				p += "?path=" + url.QueryEscape(file)
			}
			return s.URL + p
		}
		type req struct{ key, url, body string }
		reqs := []req{
			{"", concrete(running.ID, "f.txt"), "{}"},
			{key, concrete("sb-0000000000000000", "f.txt"), "{}"},
			{key, concrete(ended.ID, "f.txt"), "{}"},
		}
		target := running.ID
		if op == "DELETE /v1/sandboxes/{id}" {
			victim, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
			if err != nil {
				t.Fatal(err)
			}
			target = victim.ID
		}
		for _, body := range []string{"null", `{"zz":1}`, "", "{}"} {
			reqs = append(reqs, req{key, concrete(target, "missing/nope.txt"), body})
		}
		reqs = append(reqs, req{key, concrete(target, "f.txt") + map[bool]string{true: "&", false: "?"}[strings.Contains(tmpl, "/files")] + "zz=1", "{}"})
		for _, rq := range reqs {
			st, _, body := raw(t, method, rq.url, rq.key, strings.NewReader(rq.body))
			if st >= 500 {
				t.Errorf("%s %s %q: %d %s", method, rq.url, rq.body, st, body)
			}
			if seen[op] == nil {
				seen[op] = map[int]bool{}
			}
			seen[op][st] = true
		}
	}
	for _, op := range names {
		t.Logf("%s: %v", op, seen[op])
	}
}
