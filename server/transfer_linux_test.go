package server_test

import (
	"archive/tar"
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestE2EMultipartUpload: PUT files with a multipart/form-data body (curl
// -F file=@x) stores the file's content, not the multipart encoding.
func TestE2EMultipartUpload(t *testing.T) {
	e := newE2E(t, "multipart")
	s, key, c, ctx := e.s, e.key, e.c, e.ctx
	sb := e.sandbox(t, client.CreateRequest{})
	send := func(parts ...string) (int, []byte) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		mw.WriteField("note", "ignored")
		for _, p := range parts {
			fw, _ := mw.CreateFormFile("file", "x.txt")
			io.WriteString(fw, p)
		}
		mw.Close()
		req, _ := http.NewRequest("PUT", s.URL+"/v1/sandboxes/"+sb.ID+"/files?path=up.txt", &buf)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if st, body := send("hello\nworld\n"); st != 200 {
		t.Fatalf("multipart upload: %d %s", st, body)
	}
	if got, err := c.ReadFile(ctx, sb.ID, "up.txt"); err != nil || string(got) != "hello\nworld\n" {
		t.Fatalf("uploaded file holds %q (%v)", got, err)
	}
	if st, body := send("a", "b"); st != 400 {
		t.Fatalf("two file parts: %d %s", st, body)
	}
}

// TestE2ETarDownload: GET files?format=tar returns a directory as a tar
// archive made inside the sandbox; a file, a missing path and an archive
// over the size cap are refused.
func TestE2ETarDownload(t *testing.T) {
	e := newE2E(t, "tar", "--max-file-bytes", "1048576")
	s, key, c, ctx := e.s, e.key, e.c, e.ctx
	sb := e.sandbox(t, client.CreateRequest{})
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "mkdir -p d/sub && echo one > d/a.txt && echo two > d/sub/b.txt && ln -s /etc/passwd d/link && head -c 2000000 /dev/zero > big"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("setup: %+v %v", res, err)
	}
	url := s.URL + "/v1/sandboxes/" + sb.ID + "/files?format=tar&path="
	st, _, body := raw(t, "GET", url+"d", key, nil)
	if st != 200 {
		t.Fatalf("tar download: %d %s", st, body)
	}
	tr := tar.NewReader(bytes.NewReader(body))
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("archive: %v", err)
		}
		b, _ := io.ReadAll(tr)
		got[strings.TrimPrefix(h.Name, "./")] = string(b) + h.Linkname
	}
	want := map[string]string{"": "", "a.txt": "one\n", "sub/": "", "sub/b.txt": "two\n", "link": "/etc/passwd"}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	for n, v := range want {
		if n == "" {
			continue
		}
		if got[n] != v {
			t.Fatalf("archive entries %v: %q is %q, want %q", names, n, got[n], v)
		}
	}
	for _, tc := range []struct {
		path   string
		status int
	}{{"d/a.txt", 400}, {"nope", 404}, {"/workspace", 413}, {"/workspace/nope/..", 400}} {
		if st, _, body := raw(t, "GET", url+tc.path, key, nil); st != tc.status {
			t.Errorf("tar of %s: %d %s, want %d", tc.path, st, body, tc.status)
		}
	}
}
