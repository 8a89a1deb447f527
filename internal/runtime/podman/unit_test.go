package podman

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestQualify(t *testing.T) {
	for in, want := range map[string]string{
		"ferry-ptest":                "localhost/ferry-ptest:latest",
		"ferry-ptest:v1":             "localhost/ferry-ptest:v1",
		"localhost/ferry":            "localhost/ferry:latest",
		"lab/ferry:2":                "localhost/lab/ferry:2",
		"quay.io/x/y":                "quay.io/x/y:latest",
		"localhost:5000/ferry":       "localhost:5000/ferry:latest",
		"localhost:5000/ferry:v2":    "localhost:5000/ferry:v2",
		"docker.io/library/busybox":  "docker.io/library/busybox:latest",
		"localhost/ferry-ptest:last": "localhost/ferry-ptest:last",
	} {
		if got := qualify(in); got != want {
			t.Errorf("qualify(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDockerArchiveReproducibleID(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "layer.tar")
	if err := os.WriteFile(layer, []byte("not really a tar, the content is opaque here"), 0o644); err != nil {
		t.Fatal(err)
	}
	id1, err := writeDockerArchive(filepath.Join(dir, "a.tar"), layer, "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	id2, err := writeDockerArchive(filepath.Join(dir, "b.tar"), layer, "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 || len(id1) != 64 {
		t.Fatalf("ids %q and %q, want equal sha256 hex", id1, id2)
	}

	f, err := os.Open(filepath.Join(dir, "a.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	var m []manifestEntry
	if err := json.Unmarshal(files["manifest.json"], &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0].Config != id1+".json" || m[0].Layers[0] != "layer.tar" || m[0].RepoTags[0] != "localhost/x:latest" {
		t.Fatalf("manifest %+v", m)
	}
	var cfg imageConfig
	if err := json.Unmarshal(files[id1+".json"], &cfg); err != nil {
		t.Fatal(err)
	}
	// sha256 of the layer bytes written above.
	if len(cfg.RootFS.DiffIDs) != 1 || !strings.HasPrefix(cfg.RootFS.DiffIDs[0], "sha256:") {
		t.Fatalf("diff_ids %v", cfg.RootFS.DiffIDs)
	}
	if string(files["layer.tar"]) != "not really a tar, the content is opaque here" {
		t.Fatal("layer content changed")
	}
}
