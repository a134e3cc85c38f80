package agent

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// MetadataXattrPrefix is the extended-attribute namespace of a file's
// user-defined metadata (E2B's file metadata): key K is the attribute
// "user.e2b.K".
const MetadataXattrPrefix = "user.e2b."

// MaxMetadataBytes caps one file's metadata: keys (with the prefix) and
// values together.
const MaxMetadataBytes = 4096

// CheckMetadata refuses metadata a file cannot carry: empty keys, keys or
// values that are not printable US-ASCII, names beyond the kernel's 255
// bytes, more than MaxMetadataBytes in all.
func CheckMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if k == "" || len(MetadataXattrPrefix)+len(k) > 255 {
			return fmt.Errorf("metadata key %q: 1 to %d bytes", k, 255-len(MetadataXattrPrefix))
		}
		for _, s := range []string{k, v} {
			for i := 0; i < len(s); i++ {
				if s[i] < 0x20 || s[i] > 0x7e {
					return fmt.Errorf("metadata %q: only printable US-ASCII", k)
				}
			}
		}
		total += len(MetadataXattrPrefix) + len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes is more than the %d a file may carry", total, MaxMetadataBytes)
	}
	return nil
}

// metadataNames lists the metadata attribute names of the open file fd.
func metadataNames(fd int) ([]string, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if strings.HasPrefix(name, MetadataXattrPrefix) {
				out = append(out, name)
			}
		}
		return out, nil
	}
}

// replaceMetadata makes md the whole metadata of the open file fd: keys
// it lacks are removed.
func replaceMetadata(fd int, md map[string]string) error {
	if err := CheckMetadata(md); err != nil {
		return &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	old, err := metadataNames(fd)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return fmt.Errorf("reading metadata: %w", err)
	}
	for _, name := range old {
		if _, keep := md[strings.TrimPrefix(name, MetadataXattrPrefix)]; !keep {
			if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("removing metadata %s: %w", name, err)
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, MetadataXattrPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return &Error{Code: CodeInvalidArgument, Message: "this file system keeps no file metadata (extended attributes)"}
			}
			return fmt.Errorf("writing metadata %s: %w", k, err)
		}
	}
	return nil
}

// readMetadata returns the metadata of path (not following a final
// symlink), nil if it has none or its file system keeps none.
func readMetadata(path string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n == 0 {
		return nil
	}
	var md map[string]string
	val := make([]byte, MaxMetadataBytes)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		k, ok := strings.CutPrefix(name, MetadataXattrPrefix)
		if !ok || k == "" {
			continue
		}
		m, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = string(val[:m])
	}
	return md
}
