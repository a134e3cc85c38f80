package egress

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// SOCKS5 constants (RFC 1928).
const (
	socksVersion    = 5
	socksNoAuth     = 0x00
	socksNoMethods  = 0xff
	socksCmdConnect = 1
	socksATypIPv4   = 1
	socksATypDomain = 3
	socksATypIPv6   = 4

	socksSucceeded       = 0x00
	socksGeneralFailure  = 0x01
	socksNotAllowed      = 0x02 // connection not allowed by ruleset
	socksHostUnreach     = 0x04
	socksConnRefused     = 0x05
	socksCmdUnsupported  = 0x07
	socksATypUnsupported = 0x08
)

// serveSOCKS serves a SOCKS5 connection: one CONNECT request, then a
// tunnel. SOCKS replies carry only a code, so the reason for a refusal is
// in the log and the connection record.
func (s *session) serveSOCKS() {
	s.client.SetReadDeadline(time.Now().Add(s.p.cfg.HandshakeTimeout))
	br := bufio.NewReader(s.client)
	rec := &Record{SandboxID: s.id, Time: time.Now(), Protocol: "socks5"}
	refuse := func(code byte, reason string) {
		rec.Reason = reason
		s.socksReply(code)
		s.finish(rec, nil)
	}

	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return
	}
	if hdr[0] != socksVersion {
		rec.Reason = fmt.Sprintf("denied: not a SOCKS5 client (version byte %d)", hdr[0])
		s.finish(rec, nil)
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	noAuth := false
	for _, m := range methods {
		noAuth = noAuth || m == socksNoAuth
	}
	if !noAuth {
		s.client.Write([]byte{socksVersion, socksNoMethods})
		rec.Reason = "denied: the SOCKS5 client offered no acceptable method; the proxy takes no authentication"
		s.finish(rec, nil)
		return
	}
	if _, err := s.client.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return
	}

	var req [4]byte // VER CMD RSV ATYP
	if _, err := io.ReadFull(br, req[:]); err != nil {
		return
	}
	var host string
	switch req[3] {
	case socksATypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return
		}
		host = netip.AddrFrom4(b).String()
	case socksATypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return
		}
		host = netip.AddrFrom16(b).String()
	case socksATypDomain:
		n, err := br.ReadByte()
		if err != nil {
			return
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return
		}
		host = string(b)
	default:
		refuse(socksATypUnsupported, fmt.Sprintf("denied: SOCKS5 address type %d is not supported", req[3]))
		return
	}
	var pb [2]byte
	if _, err := io.ReadFull(br, pb[:]); err != nil {
		return
	}
	port := int(binary.BigEndian.Uint16(pb[:]))
	rec.Host, rec.Port = host, port
	if req[0] != socksVersion {
		refuse(socksGeneralFailure, fmt.Sprintf("denied: bad SOCKS5 request version %d", req[0]))
		return
	}
	if req[1] != socksCmdConnect {
		refuse(socksCmdUnsupported, fmt.Sprintf("denied: SOCKS5 command %d is not supported; only CONNECT", req[1]))
		return
	}
	t, err := parseTarget(host)
	if err != nil {
		refuse(socksNotAllowed, "denied: "+err.Error())
		return
	}
	rec.Host = t.display()
	up, fail, _ := s.connect(t, port, rec)
	if up == nil {
		code := byte(socksNotAllowed)
		switch fail {
		case failResolve:
			code = socksHostUnreach
		case failDial:
			code = socksConnRefused
		}
		s.socksReply(code)
		s.finish(rec, nil)
		return
	}
	defer s.finish(rec, up)
	if err := s.socksReply(socksSucceeded); err != nil {
		return
	}
	s.client.SetReadDeadline(time.Time{})
	client := &bufConn{Conn: s.client, r: br}
	if inj := s.sb.injectionFor(t, port); inj != nil {
		rec.Protocol += "+inject"
		s.intercept(client, up, t, port, inj, rec)
		return
	}
	relay(client, up)
}

// socksReply sends a reply with the given code. The bound address is
// always 0.0.0.0:0: the host's addresses are none of the sandbox's business.
func (s *session) socksReply(code byte) error {
	_, err := s.client.Write([]byte{socksVersion, code, 0, socksATypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}
