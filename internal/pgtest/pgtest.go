// Package pgtest runs a throwaway PostgreSQL cluster for tests: Debian's
// server binaries, a cluster made by initdb in a temporary directory,
// listening on 127.0.0.1 only (no Unix socket) on a free port, with password
// authentication. A test package shares one cluster (Shared) and stops it
// from TestMain (StopShared); each test gets a fresh database.
//
// PostgreSQL refuses to run as root, so as root the cluster runs as the
// "postgres" user that Debian's package creates.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a running (or stopped) test cluster.
type Cluster struct {
	dir      string // temporary directory: data/ and the password file
	bin      string // directory of postgres, initdb
	port     int
	password string
	cred     *syscall.Credential // nil: run as ourselves

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error // receives the server's exit
	log  *os.File
	dbs  atomic.Int64
}

// debianRoot is where Debian's postgresql packages put each version.
const debianRoot = "/usr/lib/postgresql"

// binDir finds the newest PostgreSQL server binaries under root (Debian's
// layout: root/VERSION/bin).
func binDir(root string) (string, error) {
	ms, _ := filepath.Glob(filepath.Join(root, "*/bin/postgres"))
	slices.SortFunc(ms, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(a))))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(b))))
		return vb - va
	})
	for _, m := range ms {
		d := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgtest: PostgreSQL server binaries not found in %s/*/bin: run scripts/setup.sh --tests (installs Debian's postgresql)", root)
}

// Start creates and starts a new cluster.
func Start() (*Cluster, error) {
	bin, err := binDir(debianRoot)
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin}
	var pw [16]byte
	rand.Read(pw[:])
	c.password = hex.EncodeToString(pw[:])
	if c.dir, err = os.MkdirTemp("", "pgtest"); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgtest: PostgreSQL refuses to run as root and there is no postgres user (%v): run scripts/setup.sh --tests", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	pwFile := filepath.Join(c.dir, "pw")
	if err := os.WriteFile(pwFile, []byte(c.password+"\n"), 0o600); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if c.cred != nil {
		os.Chown(pwFile, int(c.cred.Uid), int(c.cred.Gid))
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(c.dir, "data"), "-U", "postgres",
		"--auth=scram-sha-256", "--pwfile="+pwFile, "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	initdb.Dir = c.dir
	if out, err := initdb.CombinedOutput(); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	// The port was free a moment ago; another process (a test package
	// running in parallel) may take it first, so try a few.
	for try := 0; ; try++ {
		if c.port, err = freePort(); err != nil {
			c.cleanup()
			return nil, err
		}
		if err = c.Resume(); err == nil {
			return c, nil
		}
		if try == 2 {
			c.cleanup()
			return nil, err
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Resume starts the server of a stopped cluster (Start starts it the first
// time), on the same port, and waits until it accepts connections.
func (c *Cluster) Resume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgtest: already running")
	}
	log, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", filepath.Join(c.dir, "data"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(c.port),
		"-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "shared_buffers=16MB", "-c", "max_connections=200")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = c.dir
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	c.cmd, c.done, c.log = cmd, done, log
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case werr := <-done:
			c.cmd = nil
			log.Close()
			out, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
			return fmt.Errorf("pgtest: postgres exited (%v):\n%s", werr, out)
		default:
		}
		if time.Now().After(deadline) {
			c.stopLocked()
			return fmt.Errorf("pgtest: postgres not ready after 60s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns the URL of database db, with the password.
func (c *Cluster) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", c.password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Password returns the cluster's password, for tests that check it is
// never shown.
func (c *Cluster) Password() string { return c.password }

// NewDatabase creates an empty database and returns its URL.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", c.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return c.URL(name)
}

// Stop stops the server (fast shutdown: open connections are closed) and
// waits for it to exit; the cluster can be resumed.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked()
}

func (c *Cluster) stopLocked() error {
	if c.cmd == nil {
		return nil
	}
	c.cmd.Process.Signal(syscall.SIGINT)
	var err error
	select {
	case err = <-c.done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		err = <-c.done
	}
	c.cmd = nil
	c.log.Close()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil // killed by our signal
	}
	return err
}

// Close stops the server and removes the cluster's files.
func (c *Cluster) Close() error {
	err := c.Stop()
	c.cleanup()
	return err
}

func (c *Cluster) cleanup() {
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
)

// Shared returns the test package's cluster, starting it on first use; t
// fails if PostgreSQL cannot run (with "run scripts/setup.sh --tests" when it is not
// installed): tests never skip silently. Stop it with StopShared from
// TestMain.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = Start() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// StopShared stops and removes the cluster Shared started, if any.
func StopShared() {
	if shared != nil {
		shared.Close()
	}
}
