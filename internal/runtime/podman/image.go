package podman

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/internal/imagearchive"
)

// ImportRootfs packs rootfsDir as a one-layer image and loads it into the
// host's storage under the name image.
//
// `podman restore --import` looks the image up by ID, so the image must
// have the same ID on every host. `podman import` stamps the current time
// into the image config and so yields a new ID each time; an imagearchive
// does not.
func (h Host) ImportRootfs(ctx context.Context, rootfsDir, image string) error {
	h.prepare()
	tmp, err := os.MkdirTemp(h.path("tmp"), "import-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	archive := filepath.Join(tmp, "image.tar")
	if _, err := imagearchive.FromDir(ctx, rootfsDir, archive, qualify(image)); err != nil {
		return err
	}
	_, err = h.podman(ctx, "load", "--quiet", "--input", archive)
	return err
}

// qualify turns a short image name into the fully qualified local name
// that `podman import` would give it (localhost/NAME:latest).
func qualify(image string) string {
	name, tag := image, ":latest"
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		name, tag = image[:i], image[i:]
	}
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		name = "localhost/" + name
	}
	return name + tag
}
