package policy

// ValidEnvKey reports whether k is a portable environment variable name:
// [A-Za-z_][A-Za-z0-9_]*, at most 128 bytes. (A loop, not a regexp: counted
// repetitions compile to large programs at package init.)
func ValidEnvKey(k string) bool {
	if len(k) == 0 || len(k) > 128 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// ValidLabel reports whether k is a metadata key: 1-64 bytes of
// [A-Za-z0-9_.-].
func ValidLabel(k string) bool {
	if len(k) == 0 || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c == '.' || c == '-' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
