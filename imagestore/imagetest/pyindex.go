package imagetest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PyPackage is the package PyIndex serves: `import airlock_demo;
// airlock_demo.hello()` returns PyHello.
const (
	PyPackage = "airlock-demo"
	PyHello   = "hello from airlock_demo 1.0"
)

// Wheel builds the wheel of PyPackage 1.0 (pure Python, py3-none-any), as
// pip expects it: the module, METADATA, WHEEL and a RECORD with every
// file's sha256. It returns the file name and the bytes.
func Wheel(t testing.TB) (string, []byte) {
	t.Helper()
	const dist = "airlock_demo-1.0.dist-info/"
	files := []struct{ name, data string }{
		{"airlock_demo/__init__.py", "def hello():\n    return " + fmt.Sprintf("%q", PyHello) + "\n"},
		{dist + "METADATA", "Metadata-Version: 2.1\nName: " + PyPackage + "\nVersion: 1.0\nSummary: airlock's test package\n"},
		{dist + "WHEEL", "Wheel-Version: 1.0\nGenerator: airlock-imagetest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.data))
		sum := sha256.Sum256([]byte(f.data))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.data))
	}
	record.WriteString(dist + "RECORD,,\n")
	w, err := zw.Create(dist + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return "airlock_demo-1.0-py3-none-any.whl", buf.Bytes()
}

// PyIndex serves a package index (PEP 503 simple repository: /simple/ and
// /simple/airlock-demo/ linking the wheel with its sha256) from a
// directory, with a plain HTTP file server on 127.0.0.1. It returns the
// server's port.
func PyIndex(t testing.TB) int {
	t.Helper()
	dir := t.TempDir()
	name, whl := Wheel(t)
	sum := sha256.Sum256(whl)
	write := func(rel, data string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("packages/"+name, string(whl))
	write("simple/index.html", `<!DOCTYPE html><html><body><a href="`+PyPackage+`/">`+PyPackage+"</a></body></html>\n")
	write("simple/"+PyPackage+"/index.html", `<!DOCTYPE html><html><body><a href="../../packages/`+name+"#sha256="+hex.EncodeToString(sum[:])+`">`+name+"</a></body></html>\n")
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}
