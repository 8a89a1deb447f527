package lab

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BusyboxPath is the static busybox (Debian's busybox-static) that lab
// containers get as their userland.
const BusyboxPath = "/bin/busybox"

// Files of a minimal root filesystem.
var rootfsFiles = map[string]string{
	"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	"etc/hosts":  "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
}

// BuildRootfs fills dir with a small root filesystem: busybox and its
// applets in /bin, ferry's workload binaries (memhog, ferry-workload-*)
// from the ferry binary's directory, /etc basics and empty mount points.
func BuildRootfs(dir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return buildRootfs(dir, filepath.Dir(exe))
}

// buildRootfs is BuildRootfs with the directory holding the workloads.
func buildRootfs(dir, binDir string) error {
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{"bin", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
		{"root", 0o700}, {"tmp", 0o777 | fs.ModeSticky}, {"var/tmp", 0o777 | fs.ModeSticky}} {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		// MkdirAll's mode is masked by the umask and drops the sticky bit.
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	for name, content := range rootfsFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}

	if err := requireStatic(BusyboxPath, "install Debian's busybox-static package"); err != nil {
		return err
	}
	if err := copyFile(BusyboxPath, filepath.Join(dir, "bin", "busybox")); err != nil {
		return err
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}

	return installWorkloads(dir, binDir, "bin")
}

// installWorkloads copies ferry's static workload binaries (memhog,
// ferry-workload-*) from binDir into the directory sub of the root
// filesystem dir.
func installWorkloads(dir, binDir, sub string) error {
	if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
		return err
	}
	workloads, _ := filepath.Glob(filepath.Join(binDir, "ferry-workload-*"))
	memhog := filepath.Join(binDir, "memhog")
	if _, err := os.Stat(memhog); err != nil {
		return fmt.Errorf("workload binary %s is missing: run `make build` (it builds the workloads next to ferry)", memhog)
	}
	for _, src := range append([]string{memhog}, workloads...) {
		if err := requireStatic(src, "build it with CGO_ENABLED=0 (`make build`)"); err != nil {
			return err
		}
		// Workloads replace a same-named applet.
		dst := filepath.Join(dir, sub, filepath.Base(src))
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := copyFile(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// requireStatic fails unless path is a statically linked ELF program: the
// rootfs has no dynamic loader or libraries.
func requireStatic(path, hint string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w (%s)", path, err, hint)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; lab containers need static binaries (%s)", path, hint)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

// InstallHostProgram copies a program of this machine into rootfs at the
// same path, with every shared library ldd says it loads (and the dynamic
// loader; a static one alone), so a real server from Debian's packages
// runs in the lab's busybox root filesystem.
func InstallHostProgram(rootfs, program string) error {
	out, err := exec.Command("ldd", program).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "not a dynamic executable") {
		return fmt.Errorf("ldd %s: %w: %s", program, err, out)
	}
	files := []string{program}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	for _, f := range files {
		if err := copyHostFile(f, filepath.Join(rootfs, f)); err != nil {
			return err
		}
	}
	return nil
}

// copyHostFile copies a file's content (following symlinks) to dst.
func copyHostFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// BuildRootfsFrom is BuildRootfs with the workloads taken from binDir (a
// test's ferry build), for containers started outside the lab's own runc.
func BuildRootfsFrom(dir, binDir string) error { return buildRootfs(dir, binDir) }
