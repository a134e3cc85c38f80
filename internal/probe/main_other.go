//go:build !linux || !amd64

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "probe: only linux/amd64 is supported")
	os.Exit(2)
}
