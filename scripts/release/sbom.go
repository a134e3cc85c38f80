package main

import (
	"bytes"
	"os"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// writeSBOM writes a CycloneDX 1.6 JSON SBOM of one architecture's
// binaries: airlock as the subject, every module they link as a library
// component (package URL pkg:golang/PATH@VERSION, the go.sum hash as a
// property), all depended on by airlock. No random serial number: the same
// build gives the same file.
func writeSBOM(path string, c config, arch string, mods []module) error {
	bom := cdx.NewBOM()
	subject := "pkg:golang/airlock@" + c.version + "?goos=linux&goarch=" + arch
	bom.Metadata = &cdx.Metadata{
		Timestamp: c.date.Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "airlock scripts/release"}}},
		Component: &cdx.Component{
			BOMRef: subject, Type: cdx.ComponentTypeApplication, Name: "airlock", Version: c.version,
			PackageURL: subject,
			Licenses:   &cdx.Licenses{{License: &cdx.License{ID: "Apache-2.0"}}},
			Properties: &[]cdx.Property{{Name: "vcs.revision", Value: c.commit}},
		},
	}
	var comps []cdx.Component
	var refs []string
	for _, m := range mods {
		purl := "pkg:golang/" + m.Path + "@" + m.Version
		comp := cdx.Component{BOMRef: purl, Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version, PackageURL: purl}
		if m.Sum != "" {
			comp.Properties = &[]cdx.Property{{Name: "go.sum", Value: m.Sum}}
		}
		comps = append(comps, comp)
		refs = append(refs, purl)
	}
	bom.Components = &comps
	bom.Dependencies = &[]cdx.Dependency{{Ref: subject, Dependencies: &refs}}
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
