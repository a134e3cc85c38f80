package licenses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// module is one module of a build list, with its directory in the module
// cache.
type module struct {
	Path, Version, Dir string
	Main               bool
	Replace            *module
}

// buildModules lists the modules providing the packages (and test
// packages) of the module at dir: every module whose code airlock's
// binaries link or its tests run.
func buildModules(t *testing.T, dir string) []module {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-test", "-json=Module", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", dir, err)
	}
	seen := map[string]module{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct{ Module *module }
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || p.Module.Main {
			continue
		}
		m := *p.Module
		if m.Replace != nil {
			m = *m.Replace
		}
		seen[m.Path+"@"+m.Version] = m
	}
	var mods []module
	for _, m := range seen {
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].Path < mods[j].Path })
	return mods
}

// TestModuleLicenses lists the license of every module airlock (and its
// release tool, scripts/release) builds or tests with, and fails on a
// module without a license file, with a license the table does not know,
// or with one that is not allowed.
func TestModuleLicenses(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, dir := range []string{root, filepath.Join(root, "scripts/release")} {
		mods := buildModules(t, dir)
		if len(mods) < 10 {
			t.Fatalf("%s: only %d modules listed", dir, len(mods))
		}
		for _, m := range mods {
			if m.Dir == "" {
				t.Errorf("%s@%s: not in the module cache", m.Path, m.Version)
				continue
			}
			ids, files := Dir(m.Dir)
			if err := check(ids, files); err != nil {
				t.Errorf("%s@%s: %v", m.Path, m.Version, err)
				continue
			}
			counts[strings.Join(ids, " AND ")]++
			t.Logf("%-60s %-40s %s", m.Path, m.Version, strings.Join(ids, ", "))
		}
	}
	t.Logf("modules per license: %v", counts)
}

// check says why a module with the licenses ids found in files may not be
// used, or nil.
func check(ids, files []string) error {
	if len(files) == 0 {
		return fmt.Errorf("no license file (%s)", strings.Join(Files, ", "))
	}
	if len(ids) == 0 {
		return fmt.Errorf("unknown license in %s: add it to the table in licenses.go if it is allowed", strings.Join(files, ", "))
	}
	for _, id := range ids {
		if !Allowed[id] {
			return fmt.Errorf("license %s (in %s) is not allowed", id, strings.Join(files, ", "))
		}
	}
	return nil
}

// TestCheck: the table tells the licenses apart, and check refuses a
// copyleft license, an unknown text and a module without a license file.
func TestCheck(t *testing.T) {
	for text, want := range map[string]string{
		"Apache License\n  Version 2.0, January 2004":                                                                                                                                                   "Apache-2.0",
		"Permission is hereby granted, free of charge, to any person obtaining a copy of this software":                                                                                                 "MIT",
		"Redistribution and use in source and binary forms, with or without modification, are permitted provided that":                                                                                  "BSD-2-Clause",
		"Redistribution and use in source and binary forms ... Neither the name of Google Inc. nor the names of its contributors may be used to endorse or promote products derived from this software": "BSD-3-Clause",
		"GNU GENERAL PUBLIC LICENSE Version 3":       "GPL",
		"GNU Affero General Public License":          "AGPL",
		"GNU LESSER GENERAL PUBLIC LICENSE":          "LGPL",
		"Mozilla Public License Version 2.0":         "MPL-2.0",
		"All rights reserved. You may not use this.": "",
	} {
		if got := strings.Join(Classify(text), ","); got != want {
			t.Errorf("Classify(%q) = %q, want %q", text, got, want)
		}
	}
	if err := check([]string{"GPL"}, []string{"COPYING"}); err == nil {
		t.Error("check allowed GPL")
	}
	if err := check(nil, []string{"LICENSE"}); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Errorf("check of an unknown license: %v", err)
	}
	if err := check(nil, nil); err == nil || !strings.Contains(err.Error(), "no license file") {
		t.Errorf("check without a license file: %v", err)
	}
	if err := check([]string{"Apache-2.0", "MIT"}, []string{"LICENSE"}); err != nil {
		t.Errorf("check of Apache-2.0 and MIT: %v", err)
	}
}

// TestNoticeCurrent: NOTICE names the versions of what is copied into the
// tree as they are now (the agent-sandbox manifests' module version in
// go.mod, xterm.js's in the dashboard's package.json), so that a bump of
// either without NOTICE fails here.
func TestNoticeCurrent(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	notice := read("NOTICE")
	gomod := regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/agent-sandbox (v\S+)`).FindStringSubmatch(read("go.mod"))
	if gomod == nil {
		t.Fatal("go.mod does not require sigs.k8s.io/agent-sandbox")
	}
	if want := "sigs.k8s.io/agent-sandbox " + gomod[1]; !strings.Contains(notice, want) || !strings.Contains(read("deploy/agent-sandbox/SOURCE.md"), gomod[1]) {
		t.Errorf("NOTICE or deploy/agent-sandbox/SOURCE.md does not name %s", want)
	}
	var pkg struct {
		DevDependencies map[string]string `json:"devDependencies"`
	}
	if err := json.Unmarshal([]byte(read("dashboard/web/package.json")), &pkg); err != nil {
		t.Fatal(err)
	}
	v := pkg.DevDependencies["@xterm/xterm"]
	if v == "" {
		t.Fatal("dashboard/web/package.json has no @xterm/xterm")
	}
	if want := "@xterm/xterm " + v; !strings.Contains(notice, want) {
		t.Errorf("NOTICE does not name %s (bundled in dashboard/dist)", want)
	}
}
