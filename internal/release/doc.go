// Package release holds the tests of airlock's release artifacts:
// scripts/release.sh's archive, .deb, SBOM, OCI image and systemd unit,
// built, installed and run on this machine. It has no code of its own:
// the release program is scripts/release (a module of its own, so that
// nfpm stays out of airlock's module graph).
package release
