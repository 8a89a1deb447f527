package runc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/rootfs"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// A container whose root is an overlay (an image's read-only layers below,
// its own writable layer above, as containerd and Docker lay them out)
// moves only its own layer: the destination must hold the same image, at
// the same paths, below one of its image roots, and mounts the overlay
// again over the layer it received.

// layersMeta is the Container.Meta key of an overlay root's layers.
const layersMeta = "runc.layers"

// layers is what a destination needs to mount an overlay root again.
type layers struct {
	// Lower are the image's trees, uppermost first, as the source mounts
	// them.
	Lower []string `json:"lower"`
}

// overlayRoot describes root when it is an overlay with a writable layer:
// that layer is what moves, and the image is named by the digest of its
// trees. All empty when root is a plain directory.
func overlayRoot(root string) (upper, image string, meta []byte, err error) {
	o, err := mounts.OverlayAt(root)
	if err != nil || o == nil {
		return "", "", nil, err
	}
	if o.Upper == "" {
		return "", "", nil, fmt.Errorf("the container's root %s is a read-only overlay: it has no layer of its own to move", root)
	}
	image, err = imageDigest(o.Lower)
	if err != nil {
		return "", "", nil, err
	}
	meta, err = json.Marshal(layers{Lower: o.Lower})
	return o.Upper, image, meta, err
}

// imageDigest names an image by its trees: the manifest digest of each,
// combined in order.
func imageDigest(lower []string) (string, error) {
	var all []string
	for _, dir := range lower {
		m, err := rootfs.Scan(dir)
		if err != nil {
			return "", fmt.Errorf("image layer %s: %w", dir, err)
		}
		d, err := m.Digest()
		if err != nil {
			return "", err
		}
		all = append(all, d)
	}
	if len(all) == 1 {
		return all[0], nil
	}
	sum := sha256.Sum256([]byte(strings.Join(all, "\n")))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// imageHere checks that this host holds the image c's layer sits on, and
// may lend it: every tree below one of roots (the agent's --image-root:
// an arbitrary host directory must never become part of a container's
// root), with the digest the source saw. It returns the trees.
func imageHere(c *runtime.Container, roots []string) ([]string, error) {
	var l layers
	if err := json.Unmarshal(c.Meta[layersMeta], &l); err != nil || len(l.Lower) == 0 {
		return nil, fmt.Errorf("source sent unreadable overlay layers: %v", err)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("the container's root is an overlay over image %s at %s: only its own layer moves, so the image must be here, below one of this agent's image roots (agent --image-root), and none is set",
			c.Image, strings.Join(l.Lower, ":"))
	}
	notHere := func(dir string) error {
		return fmt.Errorf("image %s is not on this host (%s is missing): unpack it here first, at the same path", c.Image, dir)
	}
	for _, dir := range l.Lower {
		if err := underRoot(dir, roots); errors.Is(err, os.ErrNotExist) {
			return nil, notHere(dir)
		} else if err != nil {
			return nil, err
		}
	}
	got, err := imageDigest(l.Lower)
	if errors.Is(err, os.ErrNotExist) {
		return nil, notHere(strings.Join(l.Lower, ":"))
	}
	if err != nil {
		return nil, err
	}
	if got != c.Image {
		return nil, fmt.Errorf("the image at %s differs from the source's (%s here, %s there)", strings.Join(l.Lower, ":"), got, c.Image)
	}
	return l.Lower, nil
}

// underRoot checks that dir, symbolic links resolved, lies below one of
// roots, and that overlayfs's option syntax can name it.
func underRoot(dir string, roots []string) error {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, ",:\\") {
		return fmt.Errorf("image layer %q: want an absolute path without ',', ':' or '\\'", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for _, root := range roots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(r, real); err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") {
			return nil
		}
	}
	return fmt.Errorf("image layer %s is not below an image root of this agent (%s)", dir, strings.Join(roots, ", "))
}
