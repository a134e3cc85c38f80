package server_test

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	it "airlock/imagestore/imagetest"
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
