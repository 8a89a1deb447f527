package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/engine"
)

// zdtmDir is where scripts/setup.sh builds CRIU's own zdtm tests.
func zdtmDir() string {
	base := os.Getenv("FERRY_CACHE")
	if base == "" {
		base = "/var/cache/ferry"
	}
	return filepath.Join(base, "zdtm-4.2.1")
}

// TestInotifyInAnOverlayRoot: a watch on a file of a container's overlay
// root. The kernel exports no handles for overlay files, so CRIU looks
// for the watched inode's path in its irmap scan paths and a few hints
// of its own (/etc, /var/log...): a file elsewhere (/app-watched here) was
// never found and the container did not dump ("fsnotify: Can't dump that
// handle"). ferry names the top of the container's root as the scan
// paths (criu.IrmapScanPaths). memhog's VERIFY writes the file and checks
// that the restored watch reports it; CRIU's own zdtm test inotify02 runs
// in the container too and checks its watches once told to stop.
func TestInotifyInAnOverlayRoot(t *testing.T) {
	bin, l, h1, h2 := dockerLab(t)
	for _, mode := range []string{engine.ModeCold, engine.ModePrecopy} {
		t.Run("watch-"+mode, func(t *testing.T) {
			name := "dkw-" + mode
			t.Cleanup(func() {
				for _, h := range l.Hosts[:2] {
					_ = l.RemoveFrom(context.Background(), "docker", h.Name, name)
				}
			})
			dk(t, h1, append(append([]string{"run", "-d", "--name", name, "-p", memhogPort + ":" + memhogPort + "/udp", dockerWorkload},
				memhogArgs("64M", "200")...), "--watch", "/app-watched")...)
			p := startProbe(t, l, bin, "64M")
			rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: mode, Runtime: "docker"})
			checkMoved(t, "docker", mode, rep, pr, perr)
		})
	}
	t.Run("zdtm-inotify02", func(t *testing.T) {
		const test = "inotify02"
		prog := filepath.Join(zdtmDir(), test)
		if _, err := os.Stat(prog); err != nil {
			t.Skipf("CRIU's zdtm test %s is not built (scripts/setup.sh builds it): %v", test, err)
		}
		name := "dkz-" + test
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = l.RemoveFrom(context.Background(), "docker", h.Name, name)
			}
		})
		dk(t, h1, "create", "--name", name, "--network", "none", dockerWorkload, "/bin/sh", "-c",
			"mkdir -p /zd && cd /zd && /"+test+" --pidfile=/zd/t.pid --outfile=/zd/t.out --dirname=/zd/d; exec sleep 100000")
		dk(t, h1, "cp", prog, name+":/"+test)
		dk(t, h1, "start", name)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := dkTry(h1, "exec", name, "cat", "/zd/t.pid"); err == nil {
				break
			}
		}
		migrateCold(t, l, name)
		dk(t, h2, "exec", name, "/bin/sh", "-c", "kill -TERM $(cat /zd/t.pid)")
		var out string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if out, _ = dkTry(h2, "exec", name, "cat", "/zd/t.out"); strings.Contains(out, "PASS") || strings.Contains(out, "FAIL") {
				break
			}
		}
		if !strings.Contains(out, "PASS") {
			t.Errorf("%s after the move: %q", test, out)
		}
	})
}
