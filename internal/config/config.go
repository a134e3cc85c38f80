// Package config reads the configuration file of `airlock serve`: a TOML
// document whose keys are serve's flag names (without the dashes) and
// whose values are what the flag would be given. A flag given on the
// command line overrides the file; a key that names no flag, a table, or a
// value a flag refuses is an error naming the key, so a typo never passes
// as a default silently.
package config

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is read when no --config is given and a file is there.
const DefaultPath = "/etc/airlock/config.toml"

// Options tune Apply.
type Options struct {
	// Repeatable reports whether a flag accumulates its values (such as
	// --approver-key): only those take an array. Nil means none does.
	Repeatable func(*flag.Flag) bool
	// Reserved are flag names the file may not set (such as "config").
	Reserved []string
}

// Apply reads the TOML file at path and sets every flag of fs the file
// names, except those the command line set (fs.Visit after Parse): the
// command line wins. It returns the keys it applied, sorted.
func Apply(fs *flag.FlagSet, path string, opts Options) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return ApplyBytes(fs, path, b, opts)
}

// ApplyBytes is Apply with the file's contents; name is used in errors.
func ApplyBytes(fs *flag.FlagSet, name string, b []byte, opts Options) ([]string, error) {
	var doc map[string]any
	if _, err := toml.Decode(string(b), &doc); err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	reserved := map[string]bool{}
	for _, r := range opts.Reserved {
		reserved[r] = true
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var applied []string
	for _, key := range keys {
		f := fs.Lookup(key)
		switch {
		case reserved[key]:
			return nil, fmt.Errorf("config %s: key %q cannot be set in the file", name, key)
		case f == nil:
			return nil, fmt.Errorf("config %s: unknown key %q (keys are the flags of 'airlock serve --help', without the dashes)", name, key)
		}
		values, err := flagArgs(doc[key])
		if err != nil {
			return nil, fmt.Errorf("config %s: key %q: %w", name, key, err)
		}
		if len(values) != 1 && (opts.Repeatable == nil || !opts.Repeatable(f)) {
			return nil, fmt.Errorf("config %s: key %q takes one value, not an array", name, key)
		}
		if onCommandLine[key] {
			continue
		}
		for _, v := range values {
			if err := fs.Set(key, v); err != nil {
				return nil, fmt.Errorf("config %s: key %q: %w", name, key, err)
			}
		}
		applied = append(applied, key)
	}
	return applied, nil
}

// flagArgs turns a TOML value into the flag arguments it stands for: one
// for a scalar, one per element for an array.
func flagArgs(v any) ([]string, error) {
	if a, ok := v.([]any); ok {
		if len(a) == 0 {
			return nil, errors.New("an empty array sets nothing: remove the key")
		}
		out := make([]string, 0, len(a))
		for _, e := range a {
			s, err := scalar(e)
			if err != nil {
				return nil, fmt.Errorf("array element: %w", err)
			}
			out = append(out, s)
		}
		return out, nil
	}
	s, err := scalar(v)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "", fmt.Errorf("%v is not a usable number", x)
		}
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case map[string]any:
		return "", errors.New("a table: this file takes flat keys named like the flags (tls-cert = \"/path\")")
	case time.Time:
		return "", errors.New("a date or time: give durations as strings (\"15m\")")
	}
	return "", fmt.Errorf("unsupported value %T", v)
}
