package server_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// wantRefused checks that err is a 400 whose message names every want.
func wantRefused(t *testing.T, what string, err error, wants ...string) {
	t.Helper()
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 400 {
		t.Errorf("%s: got %v, want a 400", what, err)
		return
	}
	for _, w := range wants {
		if !strings.Contains(ae.Message, w) {
			t.Errorf("%s: message %q does not name %q", what, ae.Message, w)
		}
	}
}

// TestServerCeilings (issue 20, finding 5): the server refuses limits
// above its ceilings (host-derived by default, lowered by flags) and above
// the creating key's own maximums, with a 400 that names the field and the
// ceiling; /v1/info reports the ceilings.
func TestServerCeilings(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	open := newKey(t, state, "open")
	capped := newKey(t, state, "capped", "--max-pids", "64", "--max-memory", "256M", "--max-timeout", "60s")
	s := startServer(t, state, "--max-memory", "1G", "--max-cpus", "1")
	ctx := ctxT(t)
	c := client.New(s.URL, open)

	// The audit's request: 1 TiB memory and disk, 4M pids, 1024 cpus.
	_, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 1 << 40, DiskBytes: 1 << 40, Pids: 4194304, CPUs: 1024}})
	wantRefused(t, "1 TiB request", err, "memory_bytes 1099511627776", "ceiling of this server: 1073741824",
		"disk_bytes 1099511627776", "pids 4194304", "cpus 1024 is above the ceiling of this server: 1")
	_, err = c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 2 << 30}})
	wantRefused(t, "memory above --max-memory", err, "memory_bytes 2147483648 (2.0 GiB) is above the ceiling of this server: 1073741824 (1.0 GiB)")
	// The standard profile's 2 CPUs are above --max-cpus 1.
	_, err = c.Create(ctx, client.CreateRequest{Profile: "standard", Limits: &client.Limits{MemoryBytes: 512 << 20}})
	wantRefused(t, "standard profile's cpus", err, "cpus 2 is above the ceiling of this server: 1")
	sb, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 1 << 30, CPUs: 1}})
	if err != nil {
		t.Fatalf("create at the ceiling: %v", err)
	}
	c.Kill(ctx, sb.ID)

	// The capped key: the strict profile's 128 pids are above its 64.
	k := client.New(s.URL, capped)
	_, err = k.Create(ctx, client.CreateRequest{})
	wantRefused(t, "key pids", err, "pids 128 is above the ceiling of this API key: 64")
	_, err = k.Create(ctx, client.CreateRequest{Limits: &client.Limits{Pids: 32, MemoryBytes: 512 << 20}})
	wantRefused(t, "key memory", err, "memory_bytes 536870912 (512.0 MiB) is above the ceiling of this API key: 268435456 (256.0 MiB)")
	_, err = k.Create(ctx, client.CreateRequest{Limits: &client.Limits{Pids: 32, MemoryBytes: 256 << 20}, Timeout: 120})
	wantRefused(t, "key timeout", err, "timeout 2m0s is above the ceiling of this API key: 1m0s")
	ok, err := k.Create(ctx, client.CreateRequest{Limits: &client.Limits{Pids: 32, MemoryBytes: 256 << 20}, Timeout: 30})
	if err != nil {
		t.Fatalf("create within the key's ceilings: %v", err)
	}
	_, err = k.SetTimeout(ctx, ok.ID, time.Hour)
	wantRefused(t, "key timeout extension", err, "timeout 1h0m0s is above the ceiling of this API key: 1m0s")
	k.Kill(ctx, ok.ID)

	// The E2B create path goes through the same checks.
	ereq, _ := http.NewRequest("POST", s.URL+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":30}`))
	ereq.Header.Set("X-API-Key", capped)
	ereq.Header.Set("Content-Type", "application/json")
	eresp, err := http.DefaultClient.Do(ereq)
	if err != nil {
		t.Fatal(err)
	}
	ebody, _ := io.ReadAll(eresp.Body)
	eresp.Body.Close()
	if eresp.StatusCode != 400 || !strings.Contains(string(ebody), "is above the ceiling of this") {
		t.Errorf("E2B create with the capped key: %d %s, want 400 naming a ceiling", eresp.StatusCode, ebody)
	}

	req, _ := http.NewRequest("GET", s.URL+"/v1/info", nil)
	req.Header.Set("Authorization", "Bearer "+open)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var info struct {
		Ceilings struct {
			MemoryBytes int64   `json:"memory_bytes"`
			CPUs        float64 `json:"cpus"`
			Pids        int64   `json:"pids"`
			DiskBytes   int64   `json:"disk_bytes"`
		} `json:"ceilings"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	if info.Ceilings.MemoryBytes != 1<<30 || info.Ceilings.CPUs != 1 || info.Ceilings.Pids <= 0 || info.Ceilings.DiskBytes <= 0 {
		t.Errorf("/v1/info ceilings: %s", body)
	}
}
