package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/uuid"
)

// purl is a Go module's package URL.
func purl(path, version string) string {
	return fmt.Sprintf("pkg:golang/%s@%s?type=module", path, version)
}

// writeSBOM writes a CycloneDX (JSON, spec 1.6) SBOM of the Go binary bin:
// the binary itself (name, version, commit, SHA-256, build settings) and every
// module linked into it, as the Go toolchain recorded them in the binary,
// plus the standard library of the Go that built it. The serial number is
// derived from the binary's hash and the timestamp is mtime, so the same
// binary gives the same SBOM.
func writeSBOM(bin, out, name, version, commit string, mtime time.Time) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return err
	}
	sum, err := fileSHA256(bin)
	if err != nil {
		return err
	}
	bom := cdx.NewBOM()
	bom.SerialNumber = "urn:uuid:" + uuid.NewSHA1(uuid.NameSpaceURL, []byte("sbom:sha256:"+sum)).String()
	props := []cdx.Property{{Name: "go:path", Value: info.Path}}
	if commit != "" {
		props = append(props, cdx.Property{Name: "vcs:commit", Value: commit})
	}
	for _, s := range info.Settings {
		props = append(props, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
	}
	rootRef := purl(info.Main.Path, version)
	bom.Metadata = &cdx.Metadata{
		Timestamp: mtime.UTC().Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "ferry tools/package", Description: "reads the module information that Go embeds in a binary (debug/buildinfo)",
		}}},
		Component: &cdx.Component{
			BOMRef:     rootRef,
			Type:       cdx.ComponentTypeApplication,
			Name:       name,
			Version:    version,
			PackageURL: rootRef,
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}},
			Properties: &props,
		},
	}
	std := cdx.Component{
		BOMRef: "pkg:golang/std@" + info.GoVersion, Type: cdx.ComponentTypeLibrary, Name: "std",
		Version: info.GoVersion, PackageURL: "pkg:golang/std@" + info.GoVersion,
		Description: "the Go standard library and runtime",
	}
	components := []cdx.Component{std}
	refs := []string{std.BOMRef}
	for _, m := range info.Deps {
		c := module(m)
		components = append(components, c)
		refs = append(refs, c.BOMRef)
	}
	bom.Components = &components
	bom.Dependencies = &[]cdx.Dependency{{Ref: rootRef, Dependencies: &refs}}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	enc := cdx.NewBOMEncoder(f, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// module is a dependency's component; a replaced module is named by its
// replacement, with the replaced one in a property.
func module(m *debug.Module) cdx.Component {
	var props []cdx.Property
	if m.Replace != nil {
		props = append(props, cdx.Property{Name: "go:replaces", Value: m.Path + "@" + m.Version})
		m = m.Replace
	}
	if m.Sum != "" {
		props = append(props, cdx.Property{Name: "go:sum", Value: m.Sum})
	}
	c := cdx.Component{
		BOMRef: purl(m.Path, m.Version), Type: cdx.ComponentTypeLibrary,
		Name: m.Path, Version: m.Version, PackageURL: purl(m.Path, m.Version),
	}
	if len(props) > 0 {
		c.Properties = &props
	}
	return c
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
