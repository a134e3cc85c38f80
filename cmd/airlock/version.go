package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	buildversion "github.com/airlock-dev/airlock/internal/version"
)

// version is this build's release version (internal/version: set at link
// time by scripts/release.sh, "0.1.0-dev" otherwise).
var version = buildversion.Get().Version

// cmdVersion prints the version, commit, commit date, Go version and
// platform: one line, or one JSON object with --json.
func cmdVersion(args []string) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "airlock version: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	in := buildversion.Get()
	if *asJSON {
		b, _ := json.MarshalIndent(in, "", "  ")
		fmt.Println(string(b))
		return 0
	}
	fmt.Println(in.String())
	return 0
}
