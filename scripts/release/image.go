package main

import (
	"bytes"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// archImage is what one architecture's image holds.
type archImage struct {
	arch  string
	files []file
}

// imageCmd is the image's default command: the API on every address of
// the container, with its state in a volume. Kubernetes manifests
// (deploy/airlock/server.yaml) run /airlock with their own arguments.
var imageCmd = []string{"serve", "--listen", "0.0.0.0:7070", "--state-dir", "/var/lib/airlock"}

// writeImage writes an OCI image layout at dir: an image index tagged
// with the version (annotation org.opencontainers.image.ref.name), one
// image per architecture, each a single layer on no base (/airlock,
// /airlock-agent, the licenses) with /airlock as its entrypoint. Push it
// with `crane push` or `skopeo copy oci:DIR:VERSION docker://...`.
func writeImage(dir string, c config, images []archImage) error {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, im := range images {
		var tb bytes.Buffer
		if err := tarFiles(&tb, "", im.files, c.date); err != nil {
			return err
		}
		data := tb.Bytes()
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return err
		}
		base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
			Created: v1.Time{Time: c.date}, CreatedBy: "airlock scripts/release " + c.version}})
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", im.arch
		cf.Created = v1.Time{Time: c.date}
		cf.Config.Entrypoint = []string{"/airlock"}
		cf.Config.Cmd = imageCmd
		cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
		cf.Config.ExposedPorts = map[string]struct{}{"7070/tcp": {}}
		cf.Config.Volumes = map[string]struct{}{"/var/lib/airlock": {}}
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.title":    "airlock",
			"org.opencontainers.image.version":  c.version,
			"org.opencontainers.image.revision": c.commit,
			"org.opencontainers.image.created":  c.date.Format("2006-01-02T15:04:05Z"),
			"org.opencontainers.image.licenses": "Apache-2.0",
		}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: im.arch}}})
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": c.version}))
}
