package native_test

import (
	"bufio"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/native"
)

// TestListenInside: a listener the host opens inside the sandbox's netns is
// reachable from the sandbox at 127.0.0.1 and served by the host process,
// while the host's own loopback stays unreachable.
func TestListenInside(t *testing.T) {
	p := strict(t)
	res := make(chan string, 1)
	cfg := native.Config{Policy: p, Listen: []string{"127.0.0.1:3128"},
		Args: []string{"python3", "-c", `
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"hello from inside\n")
print(s.recv(100).decode().strip())
`}}
	sb, err := native.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	ls := sb.Listeners()
	if len(ls) != 1 {
		t.Fatalf("%d listeners", len(ls))
	}
	go func() {
		c, err := ls[0].Accept()
		if err != nil {
			res <- err.Error()
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Write([]byte("host saw: " + line))
		c.Close()
		res <- line
	}()
	sb.Wait()
	if got := <-res; !strings.Contains(got, "hello from inside") {
		t.Fatalf("host got %q", got)
	}
}
