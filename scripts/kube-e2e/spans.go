// kube-e2e spans: the breakdown of a server's pooled creates, from the
// phases it logs at debug level (internal/spans).

package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
)

// cmdSpans is "kube-e2e spans -log FILE": for each timed operation in
// FILE (an `airlock serve --log-format json --log-level debug` log: lines
// whose msg is "manager: remote create", "kubernetes: pooled create",
// "kubernetes: connect", and the request log's POST lines), p50 and p99 of
// each phase (the fields ending in _ms). A measurement, not a check.
func cmdSpans(args []string) error {
	fs := flag.NewFlagSet("spans", flag.ContinueOnError)
	path := fs.String("log", "", "server log (JSON lines)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*path)
	if err != nil {
		return err
	}
	defer f.Close()
	// operation -> phase -> samples, phases in the order first seen.
	samples := map[string]map[string][]float64{}
	order := map[string][]string{}
	var ops []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		op, _ := line["msg"].(string)
		switch {
		case op == "manager: remote create", op == "kubernetes: pooled create", op == "kubernetes: connect":
			if op == "kubernetes: connect" {
				if r, _ := line["reused"].(bool); r {
					op += " (connection reused)"
				} else {
					op += " (dialed)"
				}
			}
		case line["route"] != nil && line["duration_ms"] != nil:
			route, _ := line["route"].(string)
			if !strings.HasPrefix(route, "POST /v1/sandboxes") {
				continue
			}
			op = "request " + route
			line = map[string]any{"duration_ms": line["duration_ms"]}
		default:
			continue
		}
		if samples[op] == nil {
			samples[op] = map[string][]float64{}
			ops = append(ops, op)
		}
		keys := make([]string, 0, len(line))
		for k := range line {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, ok := line[k].(float64)
			if !ok || !strings.HasSuffix(k, "_ms") {
				continue
			}
			if !slices.Contains(order[op], k) {
				order[op] = append(order[op], k)
			}
			samples[op][k] = append(samples[op][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, op := range ops {
		fmt.Printf("%s:\n", op)
		for _, k := range order[op] {
			s := slices.Clone(samples[op][k])
			slices.Sort(s)
			fmt.Printf("  %-22s n=%-3d p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms\n", k, len(s), pct(s, 50), pct(s, 99), s[len(s)-1])
		}
	}
	return nil
}
