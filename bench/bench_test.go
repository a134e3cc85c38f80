package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestMedian(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{2.2, nan, 7.2, 12.5}, 7.2},
		{[]float64{10, 10, 1, 1000, 11}, 10},
	}
	for _, c := range cases {
		in := append([]float64(nil), c.in...)
		if got := Median(c.in); !approx(got, c.want) {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in { // input left alone
			if !(in[i] == c.in[i] || math.IsNaN(in[i]) && math.IsNaN(c.in[i])) {
				t.Errorf("Median modified its input: %v", c.in)
			}
		}
	}
	if got := Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
	if got := Median([]float64{nan}); !math.IsNaN(got) {
		t.Errorf("Median([NaN]) = %v, want NaN", got)
	}
}

func TestMinMax(t *testing.T) {
	lo, hi := MinMax([]float64{math.NaN(), 4, -1, 9, 2})
	if lo != -1 || hi != 9 {
		t.Errorf("MinMax = %v, %v; want -1, 9", lo, hi)
	}
	lo, hi = MinMax(nil)
	if !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Errorf("MinMax(nil) = %v, %v; want NaN, NaN", lo, hi)
	}
}

func TestPairRatios(t *testing.T) {
	nan := math.NaN()
	ref := []float64{10, 12, nan, 8, 5}
	other := []float64{20, 24, 30, 32, 0}
	got := PairRatios(ref, other)
	want := []float64{0.5, 0.5, 0.25} // round 3 lacks ref, round 5 divides by 0
	if len(got) != len(want) {
		t.Fatalf("PairRatios = %v, want %v", got, want)
	}
	for i := range want {
		if !approx(got[i], want[i]) {
			t.Fatalf("PairRatios = %v, want %v", got, want)
		}
	}
	if m := Median(got); !approx(m, 0.5) {
		t.Errorf("median ratio = %v, want 0.5", m)
	}
}

// scripted returns a Measure that hands each peer its next value in turn
// (the first one is the warm-up) and an error for NaN, and records the
// order of the calls.
func scripted(values map[string][]float64, calls *[]string) Measure {
	next := map[string]int{}
	return func(p Peer) (float64, error) {
		*calls = append(*calls, p.Name)
		i := next[p.Name]
		next[p.Name]++
		v := values[p.Name][i]
		if math.IsNaN(v) {
			return 0, errors.New("scripted failure")
		}
		return v, nil
	}
}

func TestSampleStatsAndRatios(t *testing.T) {
	nan := math.NaN()
	var prepared, cleaned []string
	peer := func(name string) Peer {
		return Peer{
			Name:    name,
			Prepare: func() error { prepared = append(prepared, name); return nil },
			Cleanup: func() { cleaned = append(cleaned, name) },
		}
	}
	peers := []Peer{
		peer("bare"),
		peer(Reference),
		{Name: "gone", Missing: "not installed"},
		peer("slow"),
		peer("broken"),
	}
	values := map[string][]float64{
		//           warm-up, rounds 1..4
		"bare":    {99, 2, 3, 2, 4},
		Reference: {99, 10, 12, 11, 9},
		"slow":    {99, 20, 48, nan, 9},
		"broken":  {nan},
	}
	var calls []string
	fig := Sample(peers, UnitMS, 4, scripted(values, &calls))

	if fig.Rounds != 4 || fig.Unit != UnitMS || len(fig.Results) != len(peers) {
		t.Fatalf("figure header = %+v", fig)
	}
	bare := fig.Result("bare")
	if !approx(bare.Median, 2.5) || bare.Min != 2 || bare.Max != 4 || len(bare.Samples) != 4 {
		t.Errorf("bare = %+v", *bare)
	}
	// airlock/bare per round: 5, 4, 5.5, 2.25 -> median 4.5
	if !approx(bare.Ratio, 4.5) || bare.RatioPairs != 4 {
		t.Errorf("bare ratio = %v over %d pairs, want 4.5 over 4", bare.Ratio, bare.RatioPairs)
	}
	ref := fig.Result(Reference)
	if !approx(ref.Ratio, 1) || !approx(ref.Median, 10.5) {
		t.Errorf("airlock = %+v", *ref)
	}
	slow := fig.Result("slow")
	// rounds 1,2,4: 10/20, 12/48, 9/9 -> 0.5, 0.25, 1 -> median 0.5
	if !approx(slow.Ratio, 0.5) || slow.RatioPairs != 3 || slow.Failures != 1 ||
		!strings.HasPrefix(slow.Error, "round 3:") || !approx(slow.Median, 20) {
		t.Errorf("slow = %+v", *slow)
	}
	if gone := fig.Result("gone"); gone.Missing != "not installed" || gone.Samples != nil {
		t.Errorf("gone = %+v", *gone)
	}
	broken := fig.Result("broken")
	if !strings.HasPrefix(broken.Error, "warm-up:") || broken.Samples != nil {
		t.Errorf("broken = %+v", *broken)
	}

	// Warm-up once per runnable peer, then 4 rounds of the 3 that survived,
	// rotated by one each round.
	want := []string{"bare", Reference, "slow", "broken",
		"bare", Reference, "slow",
		Reference, "slow", "bare",
		"slow", "bare", Reference,
		"bare", Reference, "slow"}
	if strings.Join(calls, " ") != strings.Join(want, " ") {
		t.Errorf("call order\n got %v\nwant %v", calls, want)
	}
	if len(prepared) != 4 || len(cleaned) != 4 {
		t.Errorf("prepared %v, cleaned %v: want each runnable peer once", prepared, cleaned)
	}
}

func TestSampleWithoutReference(t *testing.T) {
	var calls []string
	fig := Sample([]Peer{{Name: "bare"}}, UnitMS, 2,
		scripted(map[string][]float64{"bare": {1, 2, 3}}, &calls))
	r := fig.Result("bare")
	if r.Ratio != 0 || r.RatioPairs != 0 || !approx(r.Median, 2.5) {
		t.Errorf("bare = %+v", *r)
	}
}

func TestReport(t *testing.T) {
	var calls []string
	fig := Sample([]Peer{{Name: Reference}, {Name: "bare"}, {Name: "srt", Missing: "srt not given"}},
		UnitMS, 3, scripted(map[string][]float64{Reference: {0, 4, 6, 5}, "bare": {0, 2, 2, 2}}, &calls))
	fig.Name = "cold start"
	figs := []Figure{fig}

	var tbl bytes.Buffer
	PrintTable(&tbl, figs)
	out := tbl.String()
	for _, s := range []string{"airlock/peer", "cold start", "2.50", "missing", "srt not given", "5.00 ms"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}

	var js bytes.Buffer
	if err := WriteJSON(&js, figs); err != nil {
		t.Fatal(err)
	}
	var back struct{ Figures []Figure }
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	got := back.Figures[0].Results[1]
	if got.Peer != "bare" || !approx(got.Ratio, 2.5) || len(got.Samples) != 3 {
		t.Errorf("JSON round trip: %+v", got)
	}
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"/usr/bin/python3", "-c", "print('a b')", ""})
	want := `/usr/bin/python3 -c 'print('\''a b'\'')' ''`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}

func TestBwrapArgs(t *testing.T) {
	args := bwrapArgs([]string{"/bin/true"})
	s := strings.Join(args, " ")
	if !strings.HasPrefix(s, "--unshare-all --die-with-parent --ro-bind /usr /usr") ||
		!strings.HasSuffix(s, "--tmpfs /tmp -- /bin/true") {
		t.Errorf("bwrap args: %s", s)
	}
	if fi, err := os.Lstat("/lib"); err == nil && fi.Mode()&os.ModeSymlink != 0 &&
		!strings.Contains(s, "--symlink usr/lib /lib") {
		t.Errorf("merged /usr not mirrored: %s", s)
	}
}

func TestBundle(t *testing.T) {
	b, err := newBundle(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.remove()
	argv := []string{"/usr/bin/python3", "-c", "pass"}
	if err := b.setArgs(argv); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(b.dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec ociSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if strings.Join(spec.Process.Args, " ") != strings.Join(argv, " ") || !spec.Root.Readonly {
		t.Errorf("spec = %+v", spec)
	}
	var ns []string
	for _, n := range spec.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	if strings.Join(ns, ",") != "pid,mount,ipc,uts,network,cgroup" {
		t.Errorf("namespaces = %v", ns)
	}
	if _, err := os.Stat(b.dir + "/rootfs/usr"); err != nil {
		t.Error(err)
	}
}

func TestDetectPeers(t *testing.T) {
	peers := DetectPeers(Options{ScratchDir: t.TempDir()})
	var names []string
	for _, p := range peers {
		names = append(names, p.Name)
		if p.Missing == "" && p.Run == nil {
			t.Errorf("peer %s is available but has no Run", p.Name)
		}
		if p.Missing != "" {
			t.Logf("%s missing: %s", p.Name, p.Missing)
		}
	}
	if strings.Join(names, " ") != strings.Join(PeerNames(), " ") {
		t.Errorf("peers = %v, want %v", names, PeerNames())
	}
	if peers[0].Name != "bare" || peers[0].Missing != "" {
		t.Errorf("bare peer = %+v", peers[0])
	}
	if _, err := exec.LookPath("srt"); err != nil && peers[6].Missing == "" {
		t.Errorf("srt is not on PATH but is not missing")
	}
	if p := DetectPeers(Options{Srt: "/nonexistent/srt"})[6]; p.Missing == "" {
		t.Errorf("srt with a bad path should be missing")
	}
}

func TestAlternateBareUnshare(t *testing.T) {
	all := DetectPeers(Options{ScratchDir: t.TempDir()})
	peers := []Peer{all[0]}
	if all[1].Missing == "" {
		peers = append(peers, all[1])
	} else {
		t.Logf("unshare missing: %s", all[1].Missing)
	}
	fig := Alternate(peers, []string{"/bin/true"}, 3)
	if strings.Join(fig.Command, " ") != "/bin/true" {
		t.Errorf("command = %v", fig.Command)
	}
	for _, r := range fig.Results {
		if r.Error != "" || len(r.Samples) != 3 || r.Median <= 0 || r.Min > r.Median || r.Median > r.Max {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
}

// TestContainerPeers runs every installed sandbox peer once, so a broken
// invocation shows up here rather than in the middle of a benchmark.
func TestContainerPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for the OCI runtimes")
	}
	for _, p := range DetectPeers(Options{ScratchDir: t.TempDir()}) {
		t.Run(p.Name, func(t *testing.T) {
			if p.Missing != "" {
				t.Skip(p.Missing)
			}
			fig := Alternate([]Peer{p}, []string{"/usr/bin/python3", "-c", "import sys; sys.exit(0)"}, 1)
			if r := fig.Results[0]; r.Error != "" || len(r.Samples) != 1 {
				t.Errorf("%+v", r)
			}
			fig = Alternate([]Peer{p}, []string{"/bin/false"}, 1)
			if r := fig.Results[0]; r.Error == "" {
				t.Errorf("/bin/false succeeded under %s", p.Name)
			}
		})
	}
}
