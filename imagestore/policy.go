package imagestore

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlock-dev/airlock/policy"
)

// ApplyTo adjusts p for a sandbox whose root is img: the image's
// environment (over the profile's; the caller re-applies what its user set
// explicitly), its working directory, and its user. An image sandbox runs as
// the image's user when that is numeric ("1000" or "1000:1000"), else as
// uid 0 of the sandbox's own user namespace: the image's root, with every
// capability dropped and no_new_privs, which owns the image's files so that
// package managers can write /usr.
func (img *Image) ApplyTo(p *policy.Policy) error {
	for _, kv := range img.Config.Env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" && !strings.ContainsRune(kv, 0) {
			p.SetEnv(k, v)
		}
	}
	if w := img.Config.WorkingDir; strings.HasPrefix(w, "/") {
		p.Filesystem.Workdir = w
	}
	p.User.UID, p.User.GID, p.User.Name = 0, 0, "root"
	if u := img.Config.User; u != "" {
		us, gs, _ := strings.Cut(u, ":")
		uid, err := strconv.Atoi(us)
		if err == nil && uid >= 0 && uid <= 65535 {
			p.User.UID, p.User.GID, p.User.Name = uid, uid, "user"
			if uid == 0 {
				p.User.Name = "root"
			}
			if gid, err := strconv.Atoi(gs); err == nil && gid >= 0 && gid <= 65535 {
				p.User.GID = gid
			}
		}
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("image %s: %w", img.Digest, err)
	}
	return nil
}

// LayerDirs returns the unpacked layer directories, lowest first.
func (img *Image) LayerDirs() []string {
	out := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		out[i] = l.Dir
	}
	return out
}
