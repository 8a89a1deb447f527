package runc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// image makes a small unpacked image below root.
func image(t *testing.T, root, name string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	for _, f := range []string{"etc/os-release", "usr/bin/tool"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(name+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func layered(t *testing.T, lower ...string) *runtime.Container {
	t.Helper()
	d, err := imageDigest(lower)
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(layers{Lower: lower})
	return &runtime.Container{Name: "c", Image: d, Meta: map[string][]byte{layersMeta: meta}}
}

func TestImageHere(t *testing.T) {
	roots := t.TempDir()
	a, b := image(t, roots, "a"), image(t, roots, "b")
	outside := image(t, t.TempDir(), "x")
	if err := os.Symlink(outside, filepath.Join(roots, "escape")); err != nil {
		t.Fatal(err)
	}
	ok := layered(t, a, b)
	if got, err := imageHere(ok, []string{roots}); err != nil || !slices.Equal(got, []string{a, b}) {
		t.Fatalf("the image here: %v %v", got, err)
	}
	changed := layered(t, a, b)
	changed.Image = layered(t, b, a).Image // the layers in another order
	escape := layered(t, outside)
	escape.Meta[layersMeta], _ = json.Marshal(layers{Lower: []string{filepath.Join(roots, "escape")}})
	gone := layered(t, a)
	gone.Meta[layersMeta], _ = json.Marshal(layers{Lower: []string{filepath.Join(roots, "missing")}})
	for _, c := range []struct {
		name  string
		c     *runtime.Container
		roots []string
		want  string
	}{
		{"no image root", ok, nil, "agent --image-root"},
		{"outside the roots", layered(t, outside), []string{roots}, "not below an image root"},
		{"through a symlink", escape, []string{roots}, "not below an image root"},
		{"the root itself", layered(t, roots), []string{roots}, "not below an image root"},
		{"another image", changed, []string{roots}, "differs from the source's"},
		{"not here", gone, []string{roots}, "is not on this host"},
		{"unreadable", &runtime.Container{Meta: map[string][]byte{layersMeta: []byte("{")}}, []string{roots}, "unreadable overlay layers"},
	} {
		if _, err := imageHere(c.c, c.roots); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	if err := underRoot(filepath.Join(roots, "a,b"), []string{roots}); err == nil {
		t.Error("a layer overlayfs's options cannot name was accepted")
	}
}

// TestOverlayRoot mounts a real overlay and reads it back as Inspect
// does: the upper layer moves, the image is named by its digest.
func TestOverlayRoot(t *testing.T) {
	testroot.Require(t, "SKIP (not a pass): mounting an overlay needs root")
	dir := t.TempDir()
	img := image(t, dir, "img")
	ov := mounts.Overlay{Lower: []string{img}, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work")}
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{ov.Upper, ov.Work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if upper, _, _, err := overlayRoot(root); err != nil || upper != "" {
		t.Fatalf("a plain directory: upper %q, %v", upper, err)
	}
	if err := ov.Mount(root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mounts.RemoveAll(dir) })
	upper, image, meta, err := overlayRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	want := layered(t, img)
	if upper != ov.Upper || image != want.Image || string(meta) != string(want.Meta[layersMeta]) {
		t.Fatalf("overlayRoot = %q %q %s, want %q %q %s", upper, image, meta, ov.Upper, want.Image, want.Meta[layersMeta])
	}
}
