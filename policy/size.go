package policy

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte size such as "512", "64k", "512M", "1.5GiB" or "2g".
// Suffixes are binary (k = 1024).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult, t = kib, t[:n-1]
		case 'm':
			mult, t = mib, t[:n-1]
		case 'g':
			mult, t = gib, t[:n-1]
		case 't':
			mult, t = gib*1024, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("bad size %q (want e.g. 512M, 1G, 64k)", s)
	}
	return int64(f * float64(mult)), nil
}
