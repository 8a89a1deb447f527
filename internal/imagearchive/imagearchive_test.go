package imagearchive

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDockerArchiveReproducibleID(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "layer.tar")
	if err := os.WriteFile(layer, []byte("not really a tar, the content is opaque here"), 0o644); err != nil {
		t.Fatal(err)
	}
	id1, err := Write(filepath.Join(dir, "a.tar"), layer, "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	id2, err := Write(filepath.Join(dir, "b.tar"), layer, "localhost/x:latest")
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

// TestFromDirSameTreeSameID: the same tree, tarred twice at different
// times, gives the same image; a changed file another.
func TestFromDirSameTreeSameID(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "x"), []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id1, err := FromDir(ctx, root, filepath.Join(dir, "a.tar"), "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	id2, err := FromDir(ctx, root, filepath.Join(dir, "b.tar"), "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 {
		t.Fatalf("same tree, IDs %s and %s", id1, id2)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "x"), []byte("two"), 0o755); err != nil {
		t.Fatal(err)
	}
	id3, err := FromDir(ctx, root, filepath.Join(dir, "c.tar"), "localhost/x:latest")
	if err != nil {
		t.Fatal(err)
	}
	if id3 == id1 {
		t.Fatal("a changed tree kept its ID")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.layer")); len(left) > 0 {
		t.Errorf("layer tars left behind: %v", left)
	}
}
