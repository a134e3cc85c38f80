package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/agext/levenshtein"
)

// closest returns the candidate nearest to word by edit distance, if it
// is near enough to be what was meant (at most 2 edits, and about half
// the word at most: a swap of two letters is 2), else "".
func closest(word string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := levenshtein.Distance(word, c, nil)
		if strings.HasPrefix(c, word) && len(word) >= 3 {
			d = min(d, 1) // a prefix: "--mem" for "--memory"
		}
		if d < bestD && d*2 <= len(word)+1 {
			best, bestD = c, d
		}
	}
	return best
}

// suggestFlag adds "did you mean --X?" to the flag package's error for an
// undefined flag when one of fs's flags is close to it.
func suggestFlag(fs *flag.FlagSet, err error) error {
	const prefix = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	name := strings.TrimLeft(strings.TrimPrefix(msg, prefix), "-")
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if c := closest(name, names); c != "" {
		return fmt.Errorf("%w; did you mean %s?", err, dashed(c))
	}
	return err
}

// dashed is a flag's name as typed: -x, --name.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// commands are the CLI's commands as 'airlock help' lists them.
var commands = []string{"run", "serve", "shell", "keys", "image", "template", "audit", "mcp", "doctor", "bench", "version", "help"}

// suggestCommand is " (did you mean X?)" for an unknown command close to
// a known one, else "".
func suggestCommand(cmd string) string {
	if c := closest(cmd, commands); c != "" {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}
