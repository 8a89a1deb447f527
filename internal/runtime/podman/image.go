package podman

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/ferry-migrate/ferry/internal/tail"
)

// ImportRootfs packs rootfsDir as a one-layer image and loads it into the
// host's storage under the name image.
//
// `podman restore --import` looks the image up by ID, so the image must
// have the same ID on every host. `podman import` stamps the current time
// into the image config and so yields a new ID each time; instead the layer
// is tarred reproducibly (sorted names, numeric owners) and loaded as a
// docker-archive with a fixed creation time. Importing the same, unchanged
// directory on any host therefore gives the same image ID.
func (h Host) ImportRootfs(ctx context.Context, rootfsDir, image string) error {
	h.prepare()
	tmp, err := os.MkdirTemp(h.path("tmp"), "import-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	layer := filepath.Join(tmp, "layer.tar")
	out, err := exec.CommandContext(ctx, "tar", "--sort=name", "--numeric-owner", "--format=gnu",
		"-C", rootfsDir, "-cf", layer, ".").CombinedOutput()
	if err != nil {
		return fmt.Errorf("tar %s: %v: %s", rootfsDir, err, tail.Lines(string(out), 6))
	}
	archive := filepath.Join(tmp, "image.tar")
	if _, err := writeDockerArchive(archive, layer, qualify(image)); err != nil {
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

// imageConfig is the part of the Docker/OCI image config that Podman needs.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		Env []string `json:"Env"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

type manifestEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeDockerArchive writes a docker-archive (the `docker save` format)
// holding one layer, and returns the image ID, the digest of its config.
// Only the config determines the ID, so the archive itself need not be
// reproducible.
func writeDockerArchive(path, layerPath, tag string) (string, error) {
	layer, err := os.Open(layerPath)
	if err != nil {
		return "", err
	}
	defer layer.Close()
	st, err := layer.Stat()
	if err != nil {
		return "", err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tw := tar.NewWriter(f)

	// The layer goes first so its digest is known when the config is
	// written.
	if err := tw.WriteHeader(&tar.Header{Name: "layer.tar", Mode: 0o644, Size: st.Size()}); err != nil {
		return "", err
	}
	sum := sha256.New()
	if _, err := io.Copy(tw, io.TeeReader(layer, sum)); err != nil {
		return "", err
	}

	var cfg imageConfig
	cfg.Architecture = runtime.GOARCH
	cfg.OS = "linux"
	cfg.Created = "1970-01-01T00:00:00Z"
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{"sha256:" + hex.EncodeToString(sum.Sum(nil))}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	cfgSum := sha256.Sum256(cfgJSON)
	id := hex.EncodeToString(cfgSum[:])

	manifest, err := json.Marshal([]manifestEntry{{Config: id + ".json", RepoTags: []string{tag}, Layers: []string{"layer.tar"}}})
	if err != nil {
		return "", err
	}
	for _, file := range []struct {
		name string
		data []byte
	}{{id + ".json", cfgJSON}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data))}); err != nil {
			return "", err
		}
		if _, err := tw.Write(file.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return id, f.Close()
}
