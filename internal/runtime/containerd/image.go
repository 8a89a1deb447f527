package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/client"

	"github.com/ferry-migrate/ferry/internal/imagearchive"
)

// ImportRootfs packs rootfsDir as a one-layer image named image (a full
// reference, e.g. localhost/ferry-workload:latest) and imports it into the
// namespace ns of the containerd at address, unpacked for overlayfs. The
// same directory gives the same digest on every host (imagearchive).
func ImportRootfs(ctx context.Context, address, ns, rootfsDir, image string) error {
	tmp, err := os.MkdirTemp("", "ferry-ctr-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	archive := filepath.Join(tmp, "image.tar")
	if _, err := imagearchive.FromDir(ctx, rootfsDir, archive, image); err != nil {
		return err
	}
	cl, err := client.New(address)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx = withNS(ctx, ns)
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	imgs, err := cl.Import(ctx, f)
	if err != nil {
		return fmt.Errorf("containerd: import %s: %w", image, err)
	}
	for _, i := range imgs {
		if err := client.NewImage(cl, i).Unpack(ctx, "overlayfs"); err != nil {
			return fmt.Errorf("containerd: unpack %s: %w", i.Name, err)
		}
	}
	return nil
}
