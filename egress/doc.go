// Package egress is airlock's host-side egress proxy and its policy
// matcher.
//
// Every sandbox has its own empty network namespace. The only way out is
// an HTTP proxy and a SOCKS5 proxy listening on the sandbox's loopback:
// sockets that the host process opens inside the sandbox's namespace
// (native.Config.Listen, native.ListenIn) and serves with Proxy.Serve, so
// that nothing inside the sandbox is on the path. Each connection is served
// as Proxy.ServeConn does:
//
//   - the requested name (or IP literal) is judged by the sandbox's Policy
//     (Policy.Decide);
//   - the proxy resolves the name itself, judges every address
//     (Policy.CheckIP refuses loopback, private, link-local, metadata and
//     other special ranges unless the policy names them) and dials exactly
//     an address it checked, never resolving again;
//   - refusals carry a reason a program can act on: an HTTP 403 whose
//     status line and body say "airlock: <reason>" (the log's wording is in
//     X-Airlock-Deny-Reason), or SOCKS5 reply 0x02 (the reason is then in
//     the log and the Record);
//   - for hosts with a Secret, the proxy terminates TLS with the sandbox's
//     own CA (CACertPEM) and adds the header to each request, so the
//     credential never enters the sandbox; other hosts are tunneled
//     untouched;
//   - every connection and refused attempt ends in one Record passed to
//     Config.OnConnection.
//
// See docs/network.md for the user-facing rules and
// docs/rationale/egress.md for the design choices.
package egress
