package egress

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
)

const benchChunk = 64 << 10

// startSink listens on 127.0.0.1 and, per connection, discards everything
// until EOF, then answers with the byte count.
func startSink(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// pump writes b.N chunks to c, half-closes it and waits for the sink's
// count, so the timing covers delivery and not just buffering.
func pump(b *testing.B, c net.Conn, r io.Reader) {
	buf := make([]byte, benchChunk)
	b.SetBytes(benchChunk)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := closeWrite(c); err != nil {
		b.Fatal(err)
	}
	var n int64
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n != int64(b.N)*benchChunk {
		b.Fatalf("sink got %d bytes, want %d", n, int64(b.N)*benchChunk)
	}
}

// BenchmarkConnectThroughput measures MB/s through an HTTP CONNECT tunnel
// of the proxy to a local sink; compare with BenchmarkDirect.
func BenchmarkConnectThroughput(b *testing.B) {
	port := startSink(b)
	tp := startProxy(b, nil, Sandbox{Policy: loopbackOK()})
	c, err := net.Dial("tcp", tp.httpAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test\r\n\r\n", port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("CONNECT: %v %v", resp, err)
	}
	pump(b, c, br)
}

// BenchmarkDirect measures MB/s of a direct connection to the same sink.
func BenchmarkDirect(b *testing.B) {
	port := startSink(b)
	c, err := net.Dial("tcp", hostPort("127.0.0.1", port))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	pump(b, c, c)
}

// BenchmarkConnectSetup measures one whole tunnel: connect to the proxy,
// CONNECT (policy, resolution, address check, dial), one echoed byte,
// close.
func BenchmarkConnectSetup(b *testing.B) {
	u := &upstreams{}
	u.echoPort = startEcho(b, "127.0.0.1:0")
	tp := startProxy(b, nil, Sandbox{Policy: loopbackOK()}, func(c *Config) { c.OnConnection = nil })
	req := fmt.Sprintf("CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test\r\n\r\n", u.echoPort)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := net.Dial("tcp", tp.httpAddr)
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(c, req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("CONNECT: %v %v", resp, err)
		}
		c.Write([]byte{'x'})
		if _, err := br.ReadByte(); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkDecide measures the matcher on a realistic allowlist.
func BenchmarkDecide(b *testing.B) {
	m, err := Policy{
		Mode:  ModeAllowlist,
		Allow: []string{"pypi.org", "files.pythonhosted.org", "*.githubusercontent.com", "github.com", "registry.npmjs.org", "api.example.com:443", "10.0.0.0/8"},
		Deny:  []string{"gist.githubusercontent.com"},
	}.compile()
	if err != nil {
		b.Fatal(err)
	}
	t, _ := parseTarget("raw.githubusercontent.com")
	ip := netip.MustParseAddr("185.199.108.133")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if d := m.decide(t, 443); !d.Allowed {
			b.Fatal(d.Reason)
		}
		if d := m.checkIP(t, 443, ip); !d.Allowed {
			b.Fatal(d.Reason)
		}
	}
}
