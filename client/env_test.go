package client

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestFromEnv: the server, key and timeout come from the environment;
// flags set in Config win; a missing or malformed value is an error
// naming what to fix, never a guess.
func TestFromEnv(t *testing.T) {
	t.Setenv(EnvURL, "http://127.0.0.1:7070/")
	t.Setenv(EnvAPIKey, "al_env")
	t.Setenv(EnvTimeout, "90s")
	c, err := FromEnv()
	if err != nil || c.base != "http://127.0.0.1:7070" || c.token != "al_env" || c.HTTP.Timeout != 90*time.Second {
		t.Fatalf("FromEnv: %+v %v", c, err)
	}
	c, err = Config{URL: "https://h:1", APIKey: "al_flag"}.WithEnv().New()
	if err != nil || c.base != "https://h:1" || c.token != "al_flag" {
		t.Fatalf("flags over env: %+v %v", c, err)
	}
	for _, tc := range []struct{ url, timeout, want string }{
		{"", "", "AIRLOCK_URL"},
		{"127.0.0.1:7070", "", "want http://HOST:PORT"},
		{"ftp://h", "", "want http://HOST:PORT"},
		{"http://al_secret@h:1", "", "not in the URL"},
		{"http://h:1", "soon", "AIRLOCK_TIMEOUT"},
		{"http://h:1", "-3s", "AIRLOCK_TIMEOUT"},
	} {
		t.Setenv(EnvURL, tc.url)
		t.Setenv(EnvTimeout, tc.timeout)
		_, err := FromEnv()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("url %q timeout %q: %v, want an error saying %q", tc.url, tc.timeout, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "al_secret") {
			t.Errorf("the error shows the key: %v", err)
		}
	}
	t.Setenv(EnvURL, "")
	t.Setenv(EnvTimeout, "")
	if _, err := FromEnv(); !errors.Is(err, ErrNoURL) {
		t.Errorf("no URL: %v, want ErrNoURL", err)
	}
}

// TestDurationsOnTheWire: TTL and TimeLimit travel as the API's seconds;
// the older seconds fields still work; a count of seconds given as a
// Duration (60 ns) and two different values are refused.
func TestDurationsOnTheWire(t *testing.T) {
	wire := func(v any) (map[string]any, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		return m, json.Unmarshal(b, &m)
	}
	for _, tc := range []struct {
		in   any
		want float64
	}{
		{CreateRequest{TTL: 10 * time.Minute}, 600},
		{CreateRequest{Timeout: 600}, 600},
		{CreateRequest{TTL: 1500 * time.Millisecond, Timeout: 1.5}, 1.5},
		{ExecRequest{Shell: "true", TimeLimit: 90 * time.Second}, 90},
		{ExecRequest{Shell: "true", Timeout: 90}, 90},
	} {
		m, err := wire(tc.in)
		if err != nil || m["timeout"] != tc.want {
			t.Errorf("%+v: %v %v, want timeout %v", tc.in, m, err, tc.want)
		}
	}
	if m, err := wire(CreateRequest{}); err != nil || m["timeout"] != nil {
		t.Errorf("no TTL: %v %v, want no timeout field", m, err)
	}
	for _, in := range []any{
		CreateRequest{TTL: 600},                         // 600 ns
		ExecRequest{TimeLimit: 60},                      // 60 ns
		CreateRequest{TTL: time.Minute, Timeout: 30},    // two values
		ExecRequest{TimeLimit: -time.Second},            // negative
		ExecRequest{TimeLimit: time.Second, Timeout: 2}, // two values
	} {
		if _, err := wire(in); err == nil {
			t.Errorf("%+v was sent", in)
		}
	}
	if _, err := wire(ExecRequest{Shell: "cat", Stdin: "\xff\xfe"}); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("stdin that is not UTF-8: %v, want a refusal (JSON would replace the bytes)", err)
	}
	if err := New("http://127.0.0.1:1", "").WriteStdin(t.Context(), "sb", 1, "\xff", false); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("WriteStdin of bytes that are not UTF-8: %v", err)
	}
	if _, err := (CodeRequest{Code: "1", Timeout: 30}).wire(); err == nil || !strings.Contains(err.Error(), "time.Second") {
		t.Errorf("CodeRequest with a 30 ns timeout: %v", err)
	}
}
