package native

// ImageRoot makes a sandbox's root an overlay of an image instead of the
// read-only host-derived root: the image's unpacked layers (shared,
// read-only) below, and a per-sandbox upper directory on disk, so the
// sandbox can write anywhere in its root while the image stays unchanged.
type ImageRoot struct {
	// Layers are the unpacked layer directories, lowest first (as
	// imagestore.Image.Layers lists them).
	Layers []string
	// Dir is a per-sandbox directory on a disk filesystem (not tmpfs, not
	// overlayfs) that holds the upper and work directories. The caller
	// creates it, keeps it for the sandbox's life and then removes it with
	// RemoveImageRoot.
	Dir string
}
