// Package e2e holds the image tests with real parts (issue 13): a Debian
// image made by mmdebstrap, a local registry and a local package index,
// driven through a real airlock server and the CLI. It has no code of its
// own; the test lives in a package of its own so that its minutes run in
// parallel with the server package's tests and under their own timeout.
package e2e
