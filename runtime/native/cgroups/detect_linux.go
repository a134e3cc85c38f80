package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	containerdcg "github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"
)

// Directory names airlock uses inside a cgroup hierarchy.
const (
	// airlockDir holds one group per sandbox.
	airlockDir = "airlock"
	// supervisorDir is the leaf the launcher moves itself into on a
	// delegated cgroup v2 subtree, so that its own cgroup has no processes
	// and may enable controllers for its children.
	supervisorDir = "airlock-supervisor"
)

// v1Wanted are the v1 hierarchies a group lives in, in the order Create
// and Add visit them. freezer is used by Kill but is not a "controller" in
// Info.Controllers.
var v1Wanted = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// v2Wanted are the v2 controllers airlock enables.
var v2Wanted = []string{"memory", "pids", "cpu"}

// host is what detection found and prepared: where groups go and with
// which controllers.
type host struct {
	info Info
	// v1 maps each v1 hierarchy in use (v1Wanted) to its airlock
	// directory; co-mounted controllers share a directory.
	v1 map[string]string
	// v2 is the directory groups are created in on cgroup v2.
	v2 string
	// oomFromFailcnt: v1 memory.oom_control has no oom_kill counter.
	oomFromFailcnt bool
	// swappinessInherited: the v1 memory root has swappiness 0, which
	// new child groups inherit.
	swappinessInherited bool
}

var (
	detectOnce sync.Once
	curHost    atomic.Pointer[host]
)

// current returns the detected host, detecting it on first use.
func current() *host {
	detectOnce.Do(func() {
		if curHost.Load() == nil {
			curHost.Store(detect())
		}
	})
	return curHost.Load()
}

// Detect reports the host's cgroup setup. The first call detects it and
// prepares airlock's root: it creates the airlock directories, enables the
// memory, pids and cpu controllers for them and, on a delegated cgroup v2
// subtree whose cgroup holds processes, moves the calling process into the
// leaf <own>/airlock-supervisor. Later calls return the cached result.
func Detect() Info {
	i := current().info
	i.Controllers = append([]string(nil), i.Controllers...)
	return i
}

// mounts are the cgroup filesystems visible to this process.
type mounts struct {
	// v2 is the first cgroup2 mount point, "" if none.
	v2 string
	// v2Opts are that mount's super options ("rw,nsdelegate,...").
	v2Opts string
	// v1 maps each v1 controller (and name=... hierarchy) to its mount
	// point.
	v1 map[string]string
}

// readMounts parses a mountinfo file for cgroup and cgroup2 mounts.
func readMounts(path string) (mounts, error) {
	m := mounts{v1: map[string]string{}}
	f, err := os.Open(path)
	if err != nil {
		return m, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		fstype, mp := fields[sep+1], unescapeMount(fields[4])
		switch fstype {
		case "cgroup2":
			if m.v2 == "" {
				m.v2 = mp
				if sep+3 < len(fields) {
					m.v2Opts = fields[sep+3]
				}
			}
		case "cgroup":
			if sep+3 >= len(fields) {
				continue
			}
			for _, opt := range strings.Split(fields[sep+3], ",") {
				if _, dup := m.v1[opt]; !dup {
					m.v1[opt] = mp
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("read mounts %s: %w", path, err)
	}
	return m, nil
}

// unescapeMount undoes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// detect finds the cgroup version to use and prepares airlock's root.
func detect() *host {
	m, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return &host{info: Info{Reason: err.Error()}}
	}
	var v1Has, v2Has []string
	for _, c := range v2Wanted {
		if m.v1[c] != "" {
			v1Has = append(v1Has, c)
		}
	}
	if m.v2 != "" {
		avail, err := readControllers(filepath.Join(m.v2, "cgroup.controllers"))
		if err == nil {
			v2Has = intersect(v2Wanted, avail)
		}
	}
	useV2 := false
	switch {
	case contains(v2Has, "memory") && contains(v2Has, "pids"):
		useV2 = true
	case contains(v1Has, "memory") && contains(v1Has, "pids"):
	case len(v2Has) > len(v1Has) || (len(v1Has) == 0 && m.v2 != ""):
		useV2 = true
	case len(v1Has) == 0:
		return &host{info: Info{Reason: "no cgroup v1 or v2 filesystem with memory, pids or cpu is mounted"}}
	}
	if !useV2 {
		return setupV1(m)
	}
	own, err := ownV2Cgroup()
	if err != nil {
		return &host{info: Info{Reason: err.Error()}}
	}
	return setupV2(m.v2, own, os.Geteuid() == 0)
}

// ownV2Cgroup returns this process's cgroup v2 path from /proc/self/cgroup.
func ownV2Cgroup() (string, error) {
	_, unified, err := containerdcg.ParseCgroupFileUnified("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	if unified == "" {
		return "", errors.New("read own cgroup: /proc/self/cgroup has no cgroup v2 entry")
	}
	return unified, nil
}

// setupV1 creates "airlock" under each v1 hierarchy airlock uses.
func setupV1(m mounts) *host {
	h := &host{v1: map[string]string{}}
	var notes []string
	var mps []string
	for _, c := range v1Wanted {
		mp := m.v1[c]
		if mp == "" {
			if c == "freezer" {
				notes = append(notes, "no v1 freezer: Kill signals processes without freezing them first")
			} else {
				notes = append(notes, "no v1 "+c+" controller")
			}
			continue
		}
		dir := filepath.Join(mp, airlockDir)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			notes = append(notes, fmt.Sprintf("v1 %s unusable: %v", c, err))
			continue
		}
		h.v1[c] = dir
		if !contains(mps, mp) {
			mps = append(mps, mp)
		}
		if c != "freezer" {
			h.info.Controllers = append(h.info.Controllers, c)
		}
	}
	if len(h.info.Controllers) == 0 {
		h.info.Reason = strings.Join(notes, "; ")
		return h
	}
	h.info.Version = 1
	h.info.Root = v1RootString(mps)
	if mem := h.v1["memory"]; mem != "" {
		// A v1 memory cgroup copies its parent's swappiness when created:
		// set it once here instead of in every Create.
		h.swappinessInherited = writeFile(filepath.Join(mem, "memory.swappiness"), "0") == nil
		if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err != nil {
			notes = append(notes, "no memory.memsw.* (swap accounting off): swap is not capped, only swappiness 0")
		}
		if _, found, err := readKey(filepath.Join(mem, "memory.oom_control"), "oom_kill"); err == nil && !found {
			h.oomFromFailcnt = true
			notes = append(notes, "memory.oom_control has no oom_kill (kernel < 4.13): Stats.OOMKills counts memory.failcnt (limit hits)")
		}
	}
	h.info.Reason = strings.Join(notes, "; ")
	return h
}

// v1RootString renders the v1 airlock directories compactly, e.g.
// "/sys/fs/cgroup/{memory,pids,cpu,cpuacct,freezer}/airlock".
func v1RootString(mps []string) string {
	parent := filepath.Dir(mps[0])
	var bases []string
	for _, mp := range mps {
		if filepath.Dir(mp) != parent {
			var dirs []string
			for _, mp := range mps {
				dirs = append(dirs, filepath.Join(mp, airlockDir))
			}
			return strings.Join(dirs, ",")
		}
		bases = append(bases, filepath.Base(mp))
	}
	if len(bases) == 1 {
		return filepath.Join(parent, bases[0], airlockDir)
	}
	return parent + "/{" + strings.Join(bases, ",") + "}/" + airlockDir
}

// setupV2 prepares airlock's root on the cgroup2 hierarchy mounted at
// mount: mount/airlock as root, else the delegated subtree own (the
// process's cgroup relative to mount).
func setupV2(mount, own string, asRoot bool) *host {
	var notes []string
	if asRoot {
		h, err := v2At(mount, filepath.Join(mount, airlockDir), true)
		if err == nil {
			return h
		}
		notes = append(notes, err.Error())
	}
	h, err := delegateV2(mount, own)
	if err != nil {
		notes = append(notes, err.Error())
		return &host{info: Info{Version: 0, Reason: strings.Join(notes, "; ")}}
	}
	if h.info.Reason != "" && len(notes) > 0 {
		// Degraded anyway: say why the root-owned location was not used
		// either. When the delegated subtree is fine, that is no reason.
		h.info.Reason = strings.Join(append(notes, h.info.Reason), "; ")
	}
	return h
}

// delegateV2 sets airlock up inside the delegated cgroup v2 subtree the
// process runs in: it moves the process into <own>/airlock-supervisor if
// <own> holds processes, then enables controllers for <own>/airlock.
func delegateV2(mount, own string) (*host, error) {
	dir := filepath.Join(mount, own)
	if filepath.Base(dir) == supervisorDir {
		// A launcher started from an earlier launcher's leaf: use the
		// same delegated subtree.
		dir = filepath.Dir(dir)
	}
	if filepath.Clean(dir) == filepath.Clean(mount) {
		return nil, fmt.Errorf("cgroup v2: process is in the root cgroup of %s and cannot use it; run airlock in a delegated cgroup (e.g. systemd-run --user --scope -p Delegate=yes)", mount)
	}
	empty, err := isEmpty(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2 delegated subtree %s: %w", dir, err)
	}
	if !empty {
		sup := filepath.Join(dir, supervisorDir)
		if err := os.Mkdir(sup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup v2 delegated subtree %s: create supervisor leaf: %w", dir, err)
		}
		if err := writeInt(filepath.Join(sup, "cgroup.procs"), int64(os.Getpid())); err != nil {
			return nil, fmt.Errorf("cgroup v2 delegated subtree %s: move launcher into supervisor leaf: %w", dir, err)
		}
	}
	h, err := v2At(dir, filepath.Join(dir, airlockDir), true)
	if err != nil {
		return nil, err
	}
	h.info.Delegated, h.info.Delegation = true, dir
	offered, _ := readControllers(filepath.Join(dir, "cgroup.controllers"))
	if len(intersect(v2Wanted, offered)) < len(v2Wanted) {
		// Nothing airlock can do from inside: the controllers must be
		// enabled above the subtree by whoever delegated it.
		h.info.Reason += fmt.Sprintf("; the delegated subtree %s offers [%s] (its cgroup.controllers): the manager that delegated it must enable memory, pids and cpu for it (systemd: Delegate=yes)",
			dir, strings.Join(offered, " "))
	}
	return h, nil
}

// v2At returns a host creating groups in root, a directory below parent in
// a cgroup2 hierarchy. With enable, it first turns on whichever of memory,
// pids and cpu are available in parent's and root's cgroup.subtree_control.
// It fails only if root cannot be created.
func v2At(parent, root string, enable bool) (*host, error) {
	var notes []string
	if enable {
		notes = append(notes, enableControllers(parent)...)
	}
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v2: create %s: %w", root, err)
	}
	if err := unix.Access(filepath.Join(root, "cgroup.procs"), unix.W_OK); err != nil {
		return nil, fmt.Errorf("cgroup v2: %s is not writable: %w", root, err)
	}
	if enable {
		notes = append(notes, enableControllers(root)...)
	}
	enabled, err := readControllers(filepath.Join(root, "cgroup.subtree_control"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	h := &host{v2: root}
	h.info = Info{Version: 2, Root: root, Controllers: intersect(v2Wanted, enabled)}
	for _, c := range v2Wanted {
		if !contains(h.info.Controllers, c) {
			notes = append(notes, fmt.Sprintf("cgroup v2 %s controller not available in %s", c, root))
		}
	}
	h.info.Reason = strings.Join(notes, "; ")
	return h, nil
}

// enableControllers enables in dir's cgroup.subtree_control each wanted
// controller that dir's cgroup.controllers offers and returns notes on
// failures. Controllers are written one by one so that one failure does
// not block the others.
func enableControllers(dir string) []string {
	avail, err := readControllers(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return []string{err.Error()}
	}
	on, err := readControllers(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return []string{err.Error()}
	}
	var notes, busy []string
	for _, c := range intersect(v2Wanted, avail) {
		if contains(on, c) {
			continue
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
			if errors.Is(err, unix.EBUSY) {
				busy = append(busy, c)
			} else {
				notes = append(notes, fmt.Sprintf("cannot enable %s: %v", c, err))
			}
		}
	}
	if len(busy) > 0 {
		notes = append(notes, fmt.Sprintf("cannot enable %s in %s: processes other than airlock are in that cgroup (start airlock alone in its delegated cgroup, e.g. systemd-run --user --scope -p Delegate=yes airlock ...)", strings.Join(busy, ","), dir))
	}
	return notes
}

// readControllers reads a space-separated controller list file.
func readControllers(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read controllers: %w", err)
	}
	return strings.Fields(string(data)), nil
}

// intersect returns the elements of want (in want's order) present in have.
func intersect(want, have []string) []string {
	var out []string
	for _, w := range want {
		if contains(have, w) {
			out = append(out, w)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// groupNames lists the group names present under the host's airlock
// directories, sorted.
func (h *host) groupNames() ([]string, error) {
	var roots []string
	if h.info.Version == 2 {
		roots = []string{h.v2}
	} else {
		for _, c := range v1Wanted {
			if d := h.v1[c]; d != "" && !contains(roots, d) {
				roots = append(roots, d)
			}
		}
	}
	seen := map[string]bool{}
	var errs []error
	for _, r := range roots {
		ents, err := os.ReadDir(r)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("list %s: %w", r, err))
			}
			continue
		}
		for _, e := range ents {
			if e.IsDir() && validName(e.Name()) {
				seen[e.Name()] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, errors.Join(errs...)
}
