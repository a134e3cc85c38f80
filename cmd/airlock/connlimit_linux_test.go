package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// dialFrom opens a TCP connection to the server at base (http://host:port)
// from the local address from (127.0.0.1, 127.0.0.2, ...: every 127/8
// address is the loopback's).
func dialFrom(from, base string, timeout time.Duration) (net.Conn, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: timeout}
	return d.Dial("tcp", u.Host)
}

// clientFrom is an HTTP client whose connections come from the address
// from, with at most one connection (kept alive).
func clientFrom(from string) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: d.DialContext,
		MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Hour}}
}

// closedByServer reports whether the server closes c (answering first or
// not) within limit, reading whatever it sends.
func closedByServer(c net.Conn, limit time.Duration) (bool, string) {
	c.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, string(b)
	}
	return true, string(b)
}

// TestServeConnectionFlood: a flood of idle connections (thousands, from
// many addresses, beyond what the server's descriptor limit could hold)
// meets the connection cap, not EMFILE, and a create on a connection the
// client already had still succeeds: half the descriptors stay for
// sandboxes.
func TestServeConnectionFlood(t *testing.T) {
	testserver.NeedRoot(t)
	// The server gets 1024 descriptors (its cap: 512 connections); the
	// flood brings 5,000.
	wrapper := filepath.Join(t.TempDir(), "airlock-1024")
	script := fmt.Sprintf("#!/bin/sh\nulimit -n 1024 || exit 1\nexec %s \"$@\"\n", airlockBin(t))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := testserver.StartBinary(t, wrapper, testserver.StateDir(t), "--no-auth", "--header-timeout", "10m")

	// A client with a connection of its own, made before the flood.
	client := clientFrom("127.0.0.2")
	resp, err := client.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	var mu sync.Mutex
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	work := make(chan string)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := range work {
				// Beyond the kernel's accept queue connects time out:
				// that is the server not taking them, as intended.
				c, err := dialFrom(from, srv.URL, 3*time.Second)
				if err == nil {
					mu.Lock()
					flood = append(flood, c)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range 5000 {
		work <- fmt.Sprintf("127.0.0.%d", 10+i%40) // 125 each: under the per-address cap
	}
	close(work)
	wg.Wait()
	t.Logf("%d of 5000 flood connections established", len(flood))

	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(srv.ReadLog(), "connection cap reached") {
		if log := srv.ReadLog(); strings.Contains(log, "too many open files") {
			t.Fatalf("the server ran out of descriptors instead of capping connections:\n%s", log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never reported its connection cap; log:\n%s", srv.ReadLog())
		}
		time.Sleep(200 * time.Millisecond)
	}

	req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatalf("create during the flood: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create during the flood: %d %s", resp.StatusCode, body)
	}
	if log := srv.ReadLog(); strings.Contains(log, "too many open files") {
		t.Fatalf("the server ran out of descriptors:\n%s", log)
	}
}

// TestServeConnsPerIP: one address holding --max-conns-per-ip connections
// gets its next one closed at once, while another address is served, and
// gets a connection again once it closes one.
func TestServeConnsPerIP(t *testing.T) {
	testserver.NeedRoot(t)
	srv := testserver.Start(t, testserver.StateDir(t), "--no-auth", "--max-conns-per-ip", "20", "--header-timeout", "10m")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 20 {
		c, err := dialFrom("127.0.0.1", srv.URL, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The server has accepted the 20 once the next one is refused; poll,
	// as accepting takes its time on a loaded machine.
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := dialFrom("127.0.0.1", srv.URL, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		closed, _ := closedByServer(c, 5*time.Second)
		c.Close()
		if closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a 21st connection from 127.0.0.1 stays open with --max-conns-per-ip 20")
		}
	}
	// The server logs the refusal after it closed the connection: poll.
	for logged := time.Now().Add(time.Minute); !strings.Contains(srv.ReadLog(), "connection from 127.0.0.1 refused"); {
		if time.Now().After(logged) {
			t.Fatalf("the refusal is not logged:\n%s", srv.ReadLog())
		}
		time.Sleep(20 * time.Millisecond)
	}

	get := func(from string) (int, error) {
		resp, err := clientFrom(from).Get(srv.URL + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get("127.0.0.2"); err != nil || code != 200 {
		t.Fatalf("another address while 127.0.0.1 is at its cap: %d %v", code, err)
	}
	held[0].Close()
	held = held[1:]
	deadline = time.Now().Add(time.Minute)
	for {
		code, err := get("127.0.0.1")
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("127.0.0.1 is not served again after closing a connection: %d %v", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeSlowBody: a request body that stops arriving fails after
// --body-idle-timeout and its connection is closed, while a body that
// keeps arriving, however slowly, is read to its end; headers that never
// end are cut off after --header-timeout.
func TestServeSlowBody(t *testing.T) {
	testserver.NeedRoot(t)
	srv := testserver.Start(t, testserver.StateDir(t), "--no-auth", "--body-idle-timeout", "5s", "--header-timeout", "3s")

	t.Run("silent body", func(t *testing.T) {
		var conns []net.Conn
		for range 100 {
			c, err := dialFrom("127.0.0.1", srv.URL, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			conns = append(conns, c)
		}
		for i, c := range conns {
			if closed, got := closedByServer(c, time.Minute); !closed {
				t.Fatalf("connection %d with a silent body still open after a minute (--body-idle-timeout 5s); got %q", i, got)
			}
		}
	})

	t.Run("slow but steady body", func(t *testing.T) {
		c, err := dialFrom("127.0.0.1", srv.URL, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// 12 s of body, a piece every 400 ms: over twice the idle timeout,
		// with room for a loaded machine's scheduling delays.
		body := strings.Repeat(" ", 30) + `{"timeout": "not a duration"}`
		fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		for i := 0; i < 30; i++ {
			c.Write([]byte(body[i : i+1]))
			time.Sleep(400 * time.Millisecond)
		}
		c.Write([]byte(body[30:]))
		c.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to a slow, steady body: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		// The body was read to its end: the answer is about its content.
		if resp.StatusCode != 400 || !strings.Contains(string(b), "timeout") || strings.Contains(string(b), "i/o timeout") {
			t.Fatalf("slow, steady body: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("silent headers", func(t *testing.T) {
		c, err := dialFrom("127.0.0.1", srv.URL, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
		if closed, got := closedByServer(c, time.Minute); !closed {
			t.Fatalf("connection with unfinished headers still open after a minute (--header-timeout 3s); got %q", got)
		}
	})
}

// TestDashboardLoginRateLimit: guessing keys at POST /ui/session from one
// address ends in 429 with Retry-After after dashboard.LoginBurst
// attempts; another address still gets to try.
func TestDashboardLoginRateLimit(t *testing.T) {
	testserver.NeedRoot(t)
	srv := testserver.Start(t, testserver.StateDir(t))
	login := func(from string) (int, string) {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", srv.URL+"/ui/session", strings.NewReader(`{"key":"al_guess"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Airlock-CSRF", "1")
		resp, err := clientFrom(from).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	var limited bool
	var retry string
	for i := 0; i < 50 && !limited; i++ {
		code, ra := login("127.0.0.1")
		switch code {
		case 401:
		case 429:
			limited, retry = true, ra
		default:
			t.Fatalf("login attempt %d: %d", i, code)
		}
	}
	if !limited {
		t.Fatal("50 wrong keys from one address in a row, none refused with 429")
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 {
		t.Fatalf("429 with Retry-After %q, want a number of seconds", retry)
	}
	if code, _ := login("127.0.0.2"); code != 401 {
		t.Fatalf("another address: %d, want 401 (its own allowance)", code)
	}
}
