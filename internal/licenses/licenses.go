// Package licenses names the license of a Go module from its license file,
// with a small explicit table of the phrases that identify each license
// this project allows (and the copyleft ones it does not). Its test lists
// the license of every module airlock's packages and tests build with and
// fails on an unknown or disallowed one.
//
// github.com/google/licensecheck, the classifier pkg.go.dev uses, is not
// served by the module proxy this project builds from; the table below
// covers the licenses of airlock's module graph, and anything it does not
// recognise fails the test for a human to look at.
package licenses

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Allowed are the licenses a dependency may have: permissive ones, and
// MPL-2.0, whose copyleft covers only the files it licenses (used
// unmodified here).
var Allowed = map[string]bool{
	"Apache-2.0": true, "MIT": true, "BSD-2-Clause": true, "BSD-3-Clause": true, "ISC": true, "MPL-2.0": true,
}

// rule identifies one license: all of its phrases occur in the text
// (lower-cased, whitespace collapsed), and none of its unless phrases.
type rule struct {
	id      string
	phrases []string
	unless  []string
}

var rules = []rule{
	{id: "Apache-2.0", phrases: []string{"apache license", "version 2.0"}},
	{id: "MIT", phrases: []string{"permission is hereby granted, free of charge, to any person obtaining a copy"}},
	{id: "BSD-3-Clause", phrases: []string{"redistribution and use in source and binary forms", "may be used to endorse or promote products derived from this software"}},
	{id: "BSD-2-Clause", phrases: []string{"redistribution and use in source and binary forms"},
		unless: []string{"may be used to endorse or promote products derived from this software"}},
	{id: "ISC", phrases: []string{"permission to use, copy, modify, and", "distribute this software for any purpose with or without fee is hereby granted"}},
	{id: "MPL-2.0", phrases: []string{"mozilla public license", "2.0"}},
	// The MPL-2.0 text names the GNU licenses as "Secondary Licenses":
	// they are not this file's license then.
	{id: "GPL", phrases: []string{"gnu general public license"}, unless: []string{"lesser", "library general", "mozilla public license"}},
	{id: "LGPL", phrases: []string{"gnu lesser general public license"}, unless: []string{"mozilla public license"}},
	{id: "AGPL", phrases: []string{"gnu affero general public license"}, unless: []string{"mozilla public license"}},
	{id: "SSPL", phrases: []string{"server side public license"}},
}

var space = regexp.MustCompile(`[\s*#/>]+`)

// Classify returns the licenses text matches, sorted; none for a text it
// does not know.
func Classify(text string) []string {
	t := space.ReplaceAllString(strings.ToLower(text), " ")
	var ids []string
	for _, r := range rules {
		ok := true
		for _, p := range r.phrases {
			ok = ok && strings.Contains(t, p)
		}
		for _, p := range r.unless {
			ok = ok && !strings.Contains(t, p)
		}
		if ok {
			ids = append(ids, r.id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Files are the names a module's license text is found under.
var Files = []string{"LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING", "COPYING.md", "LICENSE-MIT", "LICENSE-APACHE", "LICENSE-APACHE-2.0.txt", "LICENSE.MIT", "LICENSE.BSD", "LICENSE.MPL-2.0"}

// Dir classifies the license files at the root of a module's directory:
// the licenses found and the files they were found in.
func Dir(dir string) (ids, files []string) {
	seen := map[string]bool{}
	for _, n := range Files {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		files = append(files, n)
		for _, id := range Classify(string(b)) {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	sort.Strings(ids)
	return ids, files
}
