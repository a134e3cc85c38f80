package imagestore_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

// TestCrashHelperPull is the child of the crash tests: it pulls
// $AIRLOCK_TEST_PULL_REF into the store $AIRLOCK_TEST_PULL_DIR.
func TestCrashHelperPull(t *testing.T) {
	dir, ref := os.Getenv("AIRLOCK_TEST_PULL_DIR"), os.Getenv("AIRLOCK_TEST_PULL_REF")
	if dir == "" {
		t.Skip("the child of TestPullKilledLeavesNothing")
	}
	s, err := imagestore.Open(dir, imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), ref, imagestore.PullOptions{}); err != nil {
		t.Fatal(err)
	}
}

// stallingRegistry serves reg through a proxy that, while stalled, sends
// half of blob's body and then waits for release.
type stallingRegistry struct {
	URL      string
	mu       sync.Mutex
	released chan struct{}
}

func newStallingRegistry(t *testing.T, reg, blob string) *stallingRegistry {
	target, _ := url.Parse("http://" + reg)
	proxy := httputil.NewSingleHostReverseProxy(target)
	sr := &stallingRegistry{released: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+blob) {
			proxy.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		half := len(body) / 2
		w.Write(body[:half])
		w.(http.Flusher).Flush()
		select {
		case <-sr.released:
		case <-r.Context().Done():
			return
		}
		w.Write(body[half:])
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(sr.release)
	sr.URL = strings.TrimPrefix(srv.URL, "http://")
	return sr
}

func (sr *stallingRegistry) release() {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	select {
	case <-sr.released:
	default:
		close(sr.released)
	}
}

// stalledPull starts a child process pulling an image of a 4 MB
// incompressible layer through a stalling registry into a store in dir,
// and returns once the child holds half a blob and a half-unpacked layer
// in the store's tmp/.
func stalledPull(t *testing.T, dir string) (child *exec.Cmd, done <-chan struct{}, sr *stallingRegistry, ref string) {
	t.Helper()
	reg := it.Registry(t)
	noise := make([]byte, 4<<20)
	rand.Read(noise)
	img := it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/marker", Type: tar.TypeReg, Data: "x"},
		it.Entry{Name: "noise", Type: tar.TypeReg, Data: string(noise)}))
	ref = it.Push(t, reg, "crash/img:v1", img)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, _ := ls[0].Digest()
	sr = newStallingRegistry(t, reg, ld.String())
	ref = strings.Replace(ref, reg, sr.URL, 1)
	child = exec.Command(os.Args[0], "-test.run", "^TestCrashHelperPull$", "-test.count=1")
	child.Env = append(os.Environ(), "AIRLOCK_TEST_PULL_DIR="+dir, "AIRLOCK_TEST_PULL_REF="+ref)
	out := &strings.Builder{}
	child.Stdout, child.Stderr = out, out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { child.Wait(); close(exited) }()
	t.Cleanup(func() { child.Process.Kill(); <-exited })
	// Half the blob downloaded (2 MB of it written) and unpacking begun.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if tmpBytes(filepath.Join(dir, "tmp")) >= 2<<20 && len(tmpEntries(filepath.Join(dir, "tmp"), "layer-")) == 1 {
			break
		}
		select {
		case <-exited:
			t.Fatalf("the pulling child exited: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never got half way: tmp holds %v", tmpEntries(filepath.Join(dir, "tmp"), ""))
		}
	}
	return child, exited, sr, ref
}

func tmpEntries(dir, prefix string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func tmpBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestPullKilledLeavesNothing: a process killed with SIGKILL half way
// through a pull leaves a partial blob and a half-unpacked layer in the
// store's tmp/; the next Open removes them, and the image then pulls.
func TestPullKilledLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (layers keep their owners)")
	}
	dir := filepath.Join(t.TempDir(), "images")
	child, exited, sr, ref := stalledPull(t, dir)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	left := tmpEntries(filepath.Join(dir, "tmp"), "")
	if len(left) == 0 {
		t.Fatal("the killed pull left nothing: the test did not kill it mid pull")
	}
	s, err := imagestore.Open(dir, imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if left := tmpEntries(filepath.Join(dir, "tmp"), ""); len(left) != 0 {
		t.Fatalf("after a restart the store's tmp still holds %v (%d bytes)", left, tmpBytes(filepath.Join(dir, "tmp")))
	}
	sr.release()
	if _, err := s.Pull(context.Background(), ref, imagestore.PullOptions{}); err != nil {
		t.Fatalf("pull after the crash: %v", err)
	}
	if left := tmpEntries(filepath.Join(dir, "tmp"), ""); len(left) != 0 {
		t.Fatalf("tmp after a good pull: %v", left)
	}
}

// TestSweepSparesLivePull: a store opened while another process pulls
// into it (the lease on each temporary directory is held) keeps that
// pull's files, and the pull completes.
func TestSweepSparesLivePull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (layers keep their owners)")
	}
	dir := filepath.Join(t.TempDir(), "images")
	child, exited, sr, ref := stalledPull(t, dir)
	before := tmpEntries(filepath.Join(dir, "tmp"), "")
	s, err := imagestore.Open(dir, imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if after := tmpEntries(filepath.Join(dir, "tmp"), ""); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("Open swept a live pull's files: before %v, after %v", before, after)
	}
	sr.release()
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the pull did not finish")
	}
	if !child.ProcessState.Success() {
		t.Fatalf("the live pull failed after the other Open: %v", child.ProcessState)
	}
	img, err := s.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(img.Layers[0].Dir, "etc", "marker")); err != nil || string(b) != "x" {
		t.Fatalf("the pulled layer: %q %v", b, err)
	}
	if left := tmpEntries(filepath.Join(dir, "tmp"), ""); len(left) != 0 {
		t.Fatalf("tmp after the pull: %v", left)
	}
}
