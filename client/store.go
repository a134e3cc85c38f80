package client

import (
	"context"
	"net/url"
	"strings"
	"time"
)

// Image is an image of the server's store (GET /v1/images).
type Image struct {
	// Owner is the id of the key that owns the name ("" for the operator's).
	Owner string `json:"owner,omitempty"`
	// Public images may be used by every key.
	Public   bool      `json:"public,omitempty"`
	Name     string    `json:"name,omitempty"`
	Digest   string    `json:"digest"`
	Size     int64     `json:"size"`
	Created  time.Time `json:"created,omitzero"`
	Platform string    `json:"platform,omitempty"`
	Layers   []struct {
		Digest string `json:"digest"`
		DiffID string `json:"diff_id"`
		Size   int64  `json:"size"`
	} `json:"layers,omitempty"`
	Config *ImageConfig `json:"config,omitempty"`
}

// ImageConfig is the part of an image's configuration a sandbox uses.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// imagePath is /v1/images/REF: a name keeps its slashes and colon.
func imagePath(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/v1/images/" + strings.Join(parts, "/")
}

// Images lists the images the key may use: its own and the public ones.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var out struct {
		Images []Image `json:"images"`
	}
	return out.Images, c.call(ctx, "GET", "/v1/images", nil, nil, &out)
}

// Image inspects an image by name, digest or digest prefix.
func (c *Client) Image(ctx context.Context, ref string) (*Image, error) {
	var out Image
	return &out, c.call(ctx, "GET", imagePath(ref), nil, nil, &out)
}

// PullImage pulls ref from a registry on the server's allowlist
// (platform "" means linux and the server's architecture).
func (c *Client) PullImage(ctx context.Context, ref, platform string) (*Image, error) {
	var out Image
	in := map[string]string{"ref": ref}
	if platform != "" {
		in["platform"] = platform
	}
	return &out, c.call(ctx, "POST", "/v1/images", nil, in, &out)
}

// RemoveImage removes one of the key's own images.
func (c *Client) RemoveImage(ctx context.Context, ref string) (*Image, error) {
	var out Image
	return &out, c.call(ctx, "DELETE", imagePath(ref), nil, nil, &out)
}

// SnapshotImage makes a new image of a sandbox created from an image,
// with what it changed in its root; name "" means
// localhost/airlock/ID:latest.
func (c *Client) SnapshotImage(ctx context.Context, id, name string) (*Image, error) {
	var out Image
	in := map[string]string{}
	if name != "" {
		in["name"] = name
	}
	return &out, c.call(ctx, "POST", sbPath(id, "/snapshot"), nil, in, &out)
}

// Volume is a named volume of the calling key.
type Volume struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// Volumes lists the key's volumes.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	return out.Volumes, c.call(ctx, "GET", "/v1/volumes", nil, nil, &out)
}

// CreateVolume creates a volume of size bytes (4 MiB to 1 TiB).
func (c *Client) CreateVolume(ctx context.Context, name string, size int64) (*Volume, error) {
	var out Volume
	return &out, c.call(ctx, "POST", "/v1/volumes", nil, map[string]any{"name": name, "size_bytes": size}, &out)
}

// DeleteVolume deletes a volume and its data (409 while a live sandbox
// mounts it).
func (c *Client) DeleteVolume(ctx context.Context, name string) (*Volume, error) {
	var out Volume
	return &out, c.call(ctx, "DELETE", "/v1/volumes/"+url.PathEscape(name), nil, nil, &out)
}

// TemplateRequest builds an image from a Dockerfile on the server.
type TemplateRequest struct {
	Name       string `json:"name"`
	Dockerfile string `json:"dockerfile"`
	// Files is the build context: relative path to content (the whole
	// request is at most 1 MiB of JSON, the files in base64).
	Files     map[string][]byte `json:"files,omitempty"`
	BuildArgs map[string]string `json:"build_args,omitempty"`
	NoCache   bool              `json:"no_cache,omitempty"`
	// Runtime is the tier RUN steps run under ("" the server's default).
	Runtime string `json:"runtime,omitempty"`
}

// TemplateResult is a finished build.
type TemplateResult struct {
	Image  *Image `json:"image"`
	Steps  int    `json:"steps"`
	Cached int    `json:"cached"`
	// Log is the build's log (its first 256 KiB).
	Log string `json:"log"`
}

// BuildTemplate builds an image from a Dockerfile and waits for it; a
// failed step is an *Error with code build_failed whose message has the
// log.
func (c *Client) BuildTemplate(ctx context.Context, req TemplateRequest) (*TemplateResult, error) {
	var out TemplateResult
	return &out, c.call(ctx, "POST", "/v1/templates", nil, req, &out)
}
