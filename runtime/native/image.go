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
	// Disks, if set, supplies the capped upper disk ready-made; nil (or an
	// empty pool) means it is made for this start.
	Disks *DiskPool
	// Above are read-only layer directories, lowest first, put above the
	// root template airlock adds on the image (mount points, /etc files):
	// the root changes a fork carries from a memory snapshot, which may
	// change those files too.
	Above []string
}

// UpperDir is where the changes of a sandbox with root img are, on the
// host, while the sandbox lives (until RemoveImageRoot): an overlayfs upper
// directory whose files belong to the sandbox's host id range. Its content
// is the sandbox's: read it without following symlinks.
func (img *ImageRoot) UpperDir() string { return img.Dir + "/disk/upper" }

// VolumeMount puts a volume in a sandbox, read-write: Dir is the host
// directory where the volume's filesystem is mounted (its files owned by
// ids 0-65535, as the sandbox sees them), Target the path inside.
type VolumeMount struct {
	Dir    string
	Target string
}
