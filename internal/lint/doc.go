// Package lint holds TestStaticcheck, which runs staticcheck over the
// module (configuration: staticcheck.conf at the root; version: the tool
// pinned in scripts/release/go.mod).
package lint
