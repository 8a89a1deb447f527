// Package imagearchive makes a container image from a directory, in the
// docker-archive format (`docker save`) that Podman, containerd and Docker
// all load, with an ID that depends on the directory's contents only: the
// same directory loaded on two hosts gives the same image, as a move of
// only the container's own layer needs.
package imagearchive

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
	goruntime "runtime"

	"github.com/ferry-migrate/ferry/internal/tail"
)

// FromDir writes an archive of one layer holding rootfsDir to path, tagged
// tag, and returns the image ID. The layer is tarred reproducibly (sorted
// names, numeric owners) and the config carries a fixed creation time, so
// the same, unchanged directory gives the same ID on any host.
func FromDir(ctx context.Context, rootfsDir, path, tag string) (string, error) {
	layer := path + ".layer"
	defer os.Remove(layer)
	out, err := exec.CommandContext(ctx, "tar", "--sort=name", "--numeric-owner", "--format=gnu",
		"-C", rootfsDir, "-cf", layer, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tar %s: %v: %s", rootfsDir, err, tail.Lines(string(out), 6))
	}
	return Write(path, layer, tag)
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

// Write writes a docker-archive (the `docker save` format)
// holding one layer, and returns the image ID, the digest of its config.
// Only the config determines the ID, so the archive itself need not be
// reproducible.
func Write(path, layerPath, tag string) (string, error) {
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
	cfg.Architecture = goruntime.GOARCH
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
