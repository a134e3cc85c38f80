package portlink

import (
	"errors"
	"testing"
	"time"
)

// TestResolve: a link answers on its own host with its own secret only,
// and not once expired.
func TestResolve(t *testing.T) {
	l, err := New("Relay.Example.com.")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := l.Mint("key1", "sb-a", 6080, time.Hour)
	b, _ := l.Mint("key1", "sb-b", 6080, time.Hour)
	host := l.Host(a) + ":7070"
	if !l.Match(host) || l.Match("relay.example.com") || l.Match("x.l-"+a.ID+".relay.example.com") || l.Match("127.0.0.1:7070") {
		t.Fatal("Match")
	}
	k, rest, err := l.Resolve(host, "/"+a.Secret+"/vnc.html")
	if err != nil || k.Sandbox != "sb-a" || k.Port != 6080 || k.Owner != "key1" || rest != "/vnc.html" {
		t.Fatalf("Resolve = %+v %q %v", k, rest, err)
	}
	if _, rest, err := l.Resolve(host, "/"+a.Secret); err != nil || rest != "/" {
		t.Fatalf("the root: %q %v", rest, err)
	}
	for _, bad := range [][2]string{
		{host, "/" + b.Secret + "/vnc.html"},                     // another link's secret on this host
		{l.Host(b), "/" + a.Secret + "/"},                        // this secret on another link's host
		{host, "/vnc.html"},                                      // no secret
		{"l-" + a.ID + ".other.com", "/" + a.Secret + "/"},       // another domain
		{"L-" + a.ID + ".relay.example.com", "/" + a.Secret[1:]}, // part of the secret
	} {
		if _, _, err := l.Resolve(bad[0], bad[1]); !errors.Is(err, ErrNoLink) {
			t.Errorf("Resolve(%q, %q) = %v, want ErrNoLink", bad[0], bad[1], err)
		}
	}
	old, _ := l.Mint("key1", "sb-a", 6080, -time.Second)
	if _, _, err := l.Resolve(l.Host(old), "/"+old.Secret+"/"); !errors.Is(err, ErrNoLink) {
		t.Fatalf("expired link: %v", err)
	}
	if _, err := New("a/b"); err == nil {
		t.Fatal("New accepted a bad domain")
	}
}
