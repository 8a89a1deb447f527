package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// readTar maps each regular file of an archive to its contents.
func readTar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[hdr.Name] = data
		}
	}
}

// blob returns the blob a descriptor names, checking its digest and size.
func blob(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	data, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob for %s", d.Digest)
	}
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != d.Digest || int64(len(data)) != d.Size {
		t.Fatalf("blob %s: digest %s, size %d; descriptor says size %d", d.Digest, got, len(data), d.Size)
	}
	return data
}

func TestWriteImageLayout(t *testing.T) {
	img := Image{
		Ref:        "registry.k8s.io/pause:3.10.2",
		Files:      []File{{Path: "/usr/bin/pause", Mode: 0o755, Data: []byte("\x7fELF fake")}},
		Entrypoint: []string{"/usr/bin/pause"},
		Arch:       "amd64",
	}
	var out bytes.Buffer
	if err := Write(&out, img); err != nil {
		t.Fatal(err)
	}
	files := readTar(t, out.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout: %q", files["oci-layout"])
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if md.Annotations[imageNameAnnotation] != img.Ref || md.Annotations[refNameAnnotation] != "3.10.2" {
		t.Fatalf("annotations %v", md.Annotations)
	}
	if md.Platform == nil || md.Platform.Architecture != "amd64" || md.Platform.OS != "linux" {
		t.Fatalf("platform %+v", md.Platform)
	}
	var man manifest
	if err := json.Unmarshal(blob(t, files, md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(t, files, man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("layers %+v", man.Layers)
	}
	layer := blob(t, files, man.Layers[0])
	// An uncompressed layer's diff ID is its own digest.
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != man.Layers[0].Digest {
		t.Fatalf("diff IDs %v, layer %s", cfg.RootFS.DiffIDs, man.Layers[0].Digest)
	}
	if strings.Join(cfg.Config.Entrypoint, " ") != "/usr/bin/pause" || cfg.Architecture != "amd64" {
		t.Fatalf("config %+v", cfg)
	}

	tr := tar.NewReader(bytes.NewReader(layer))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Name == "usr/bin/pause" && (hdr.Mode != 0o755 || hdr.Uid != 0 || !hdr.ModTime.Equal(epoch)) {
			t.Fatalf("pause entry %+v", hdr)
		}
	}
	if got := strings.Join(names, ","); got != "usr/,usr/bin/,usr/bin/pause" {
		t.Fatalf("layer entries %s", got)
	}

	var again bytes.Buffer
	if err := Write(&again, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), again.Bytes()) {
		t.Fatal("the same image packed twice differs")
	}
}

func TestWriteRefusesBadInput(t *testing.T) {
	for name, img := range map[string]Image{
		"no name":       {Files: []File{{Path: "/x", Data: []byte("x")}}},
		"no files":      {Ref: "a/b:c"},
		"relative path": {Ref: "a/b:c", Files: []File{{Path: "x", Data: []byte("x")}}},
		"unclean path":  {Ref: "a/b:c", Files: []File{{Path: "/a/../x", Data: []byte("x")}}},
	} {
		if err := Write(io.Discard, img); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestTag(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.k8s.io/pause:3.10.2": "3.10.2",
		"localhost:5000/echo":          "latest",
		"ferry.test/echo:v1":           "v1",
	} {
		if got := tag(ref); got != want {
			t.Errorf("tag(%q) = %q, want %q", ref, got, want)
		}
	}
}
