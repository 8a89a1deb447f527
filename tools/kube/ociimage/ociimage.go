// Package ociimage packs static binaries as a one-layer OCI image in the
// image-layout format, as a tar that `ctr images import` loads. No registry
// is reachable where ferry's lab runs, so its images (the pod sandbox's
// pause, test workloads) are made this way and imported into each node's
// containerd.
//
// The output depends only on the input: fixed modification times, owners
// and order, so the same binary always gives the same image digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Media types of the image-layout format (OCI image spec v1.1).
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// refNameAnnotation and imageNameAnnotation name the image in index.json:
// the first is the OCI tag, the second the full name ctr import gives it.
const (
	refNameAnnotation   = "org.opencontainers.image.ref.name"
	imageNameAnnotation = "io.containerd.image.name"
)

// epoch is every file's modification time, so that output is reproducible.
var epoch = time.Unix(0, 0).UTC()

// File is one regular file of the image's only layer.
type File struct {
	Path string // absolute path inside the image
	Mode int64  // permission bits
	Data []byte
}

// Image is what Write packs.
type Image struct {
	// Ref is the full name, e.g. registry.k8s.io/pause:3.10.2.
	Ref        string
	Files      []File
	Entrypoint []string
	// Arch is a GOARCH value; empty means this machine's.
	Arch string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string `json:"Entrypoint,omitempty"`
		Env        []string `json:"Env,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// tag is the part of ref after its last ':' that follows the last '/'
// ("latest" when there is none), the OCI ref.name annotation's value.
func tag(ref string) string {
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return "latest"
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// layerTar is the uncompressed layer: the files' parent directories, then
// the files, in the order given.
func layerTar(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("file path %q: want a clean absolute path", f.Path)
		}
		var parents []string
		for d := path.Dir(f.Path); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes img to w as an image-layout tar: oci-layout, index.json and
// the config, layer and manifest blobs.
func Write(w io.Writer, img Image) error {
	if img.Ref == "" {
		return errors.New("image has no name")
	}
	if len(img.Files) == 0 {
		return errors.New("image has no files")
	}
	arch := img.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return err
	}
	var cfg imageConfig
	cfg.Architecture, cfg.OS = arch, "linux"
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{digestOf(layer)}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	man := manifest{
		SchemaVersion: 2,
		MediaType:     mediaTypeManifest,
		Config:        descriptor{MediaType: mediaTypeConfig, Digest: digestOf(cfgJSON), Size: int64(len(cfgJSON))},
		Layers:        []descriptor{{MediaType: mediaTypeLayer, Digest: digestOf(layer), Size: int64(len(layer))}},
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return err
	}
	idx := index{
		SchemaVersion: 2,
		MediaType:     mediaTypeIndex,
		Manifests: []descriptor{{
			MediaType: mediaTypeManifest,
			Digest:    digestOf(manJSON),
			Size:      int64(len(manJSON)),
			Platform:  &platform{Architecture: arch, OS: "linux"},
			Annotations: map[string]string{
				imageNameAnnotation: img.Ref,
				refNameAnnotation:   tag(img.Ref),
			},
		}},
	}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blob := func(data []byte) (string, []byte) {
		return "blobs/sha256/" + strings.TrimPrefix(digestOf(data), "sha256:"), data
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", idxJSON); err != nil {
		return err
	}
	for _, data := range [][]byte{cfgJSON, layer, manJSON} {
		if err := add(blob(data)); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Main is `ferry-kube image`: it packs one static binary (and its
// arguments, as the entrypoint) into an image-layout tar.
//
//	ferry-kube image --ref NAME --out FILE.tar [--path /IN/IMAGE] BINARY [ARG...]
func Main(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	ref := fs.String("ref", "", "the image's full name, e.g. registry.k8s.io/pause:3.10.2")
	out := fs.String("out", "", "the tar to write")
	inImage := fs.String("path", "", "where the binary goes in the image (default /BASENAME)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || *out == "" || fs.NArg() == 0 {
		return errors.New("usage: ferry-kube image --ref NAME --out FILE.tar [--path /IN/IMAGE] BINARY [ARG...]")
	}
	bin := fs.Arg(0)
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	dest := *inImage
	if dest == "" {
		dest = "/" + filepath.Base(bin)
	}
	img := Image{
		Ref:        *ref,
		Files:      []File{{Path: dest, Mode: 0o755, Data: data}},
		Entrypoint: append([]string{dest}, fs.Args()[1:]...),
	}
	// Written beside the target and renamed, so a reader never sees half.
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, img); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), *out)
}
