// Command execcpu measures what one API exec costs each process on the
// path: it starts `airlock serve --no-auth` (the binary given), creates one
// sandbox, runs N execs of /bin/true from C concurrent keep-alive clients,
// and prints the CPU time (user + system, from /proc/PID/stat) the server,
// the sandbox's agent and this client spent per exec, with the wall time.
// CPU per exec is a figure that a loaded machine moves much less than wall
// time; compare two builds by running them in turn.
//
// Usage:
//
//	execcpu [-n 1000] [-c 1] [-rounds 3] [-create] BINARY
//
// With -create each of the N operations is a live start instead: create a
// sandbox, run /bin/true in it (timed, as the bench's live start), then
// kill it (also counted in the server's CPU: it is part of what a live
// sandbox costs). With -get each operation is GET /v1/sandboxes/{id}: the
// cost of an API request that does nothing (HTTP, routing, the request
// log), i.e. what a connection that is not HTTP per exec could save.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/client"
)

func main() {
	n := flag.Int("n", 1000, "execs per round")
	conc := flag.Int("c", 1, "concurrent clients")
	rounds := flag.Int("rounds", 3, "rounds")
	flag.BoolVar(&creates, "create", false, "time create + exec + kill instead of exec")
	flag.BoolVar(&gets, "get", false, "time GET /v1/sandboxes/{id} instead of exec")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: execcpu [-n N] [-c C] [-rounds R] BINARY")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *n, *conc, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "execcpu:", err)
		os.Exit(1)
	}
}

// cpuOf returns the user+system time of pid and of its children it waited for.
func cpuOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ticks int64
	for _, i := range []int{11, 12} { // utime, stime (fields 14, 15)
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * (time.Second / 100), nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// creates selects the live-start mode (-create), gets the empty-request
// mode (-get).
var creates, gets bool

var listenRE = regexp.MustCompile(`https?://127\.0\.0\.1:[0-9]+`)

func run(bin string, n, conc, rounds int) error {
	dir, err := os.MkdirTemp("", "execcpu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"), "--no-auth")
	out, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u := listenRE.FindString(sc.Text()); u != "" {
				select {
				case urlc <- u:
				default:
				}
			}
		}
	}()
	var url string
	select {
	case url = <-urlc:
	case <-time.After(60 * time.Second):
		return fmt.Errorf("server did not print its address")
	}
	ctx := context.Background()
	c := client.New(url, "")
	sb, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	info, err := c.Get(ctx, sb.ID)
	if err != nil {
		return err
	}
	_ = info
	agentPid := findAgent(cmd.Process.Pid)
	one := func() error {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		return nil
	}
	if gets {
		one = func() error {
			_, err := c.Get(ctx, sb.ID)
			return err
		}
	}
	if creates {
		one = func() error {
			sb, err := c.Create(ctx, client.CreateRequest{})
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			if kerr := c.Kill(ctx, sb.ID); err == nil {
				err = kerr
			}
			return err
		}
	}
	for range 20 {
		if err := one(); err != nil {
			return err
		}
	}
	fmt.Printf("server pid %d, agent pid %d, %d clients, %d execs per round\n", cmd.Process.Pid, agentPid, conc, n)
	for r := 0; r < rounds; r++ {
		s0, _ := cpuOf(cmd.Process.Pid)
		a0, _ := cpuOf(agentPid)
		c0 := selfCPU()
		t0 := time.Now()
		var wg sync.WaitGroup
		work := make(chan struct{}, n)
		for range n {
			work <- struct{}{}
		}
		close(work)
		var ferr error
		var once sync.Once
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					if err := one(); err != nil {
						once.Do(func() { ferr = err })
						return
					}
				}
			}()
		}
		wg.Wait()
		if ferr != nil {
			return ferr
		}
		wall := time.Since(t0)
		s1, _ := cpuOf(cmd.Process.Pid)
		a1, _ := cpuOf(agentPid)
		c1 := selfCPU()
		per := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(n)/1e6) }
		if creates {
			fmt.Printf("round %d: wall %s per create+exec+kill; server cpu %s (+ the sandboxes' own, not counted)\n",
				r+1, per(wall), per(s1-s0))
			continue
		}
		fmt.Printf("round %d: wall %s/exec (%.0f execs/s); cpu per exec: server %s, agent+children %s, client %s\n",
			r+1, per(wall), float64(n)/wall.Seconds(), per(s1-s0), per(a1-a0), per(c1-c0))
	}
	return nil
}

// findAgent returns the pid of the first descendant of pid whose command
// line is an agent (airlock-agent or airlock with an agent argument).
func findAgent(pid int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if isDescendant(p, pid) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if strings.Contains(string(b), "agent") {
				return p
			}
		}
	}
	return 0
}

func isDescendant(p, anc int) bool {
	for i := 0; i < 32 && p > 1; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		pp, _ := strconv.Atoi(f[1])
		if pp == anc {
			return true
		}
		p = pp
	}
	return false
}
