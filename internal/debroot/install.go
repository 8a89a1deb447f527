package debroot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/tail"
)

// StepError is a failed step of Install: which one, why, and the tool's
// output (apt's, for the install itself).
type StepError struct {
	Root   string
	Step   string
	Err    error
	Output string
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("install into %s: %s: %v", e.Root, e.Step, e.Err)
	if e.Output != "" {
		msg += "\n" + tail.Lines(e.Output, 40)
	}
	return msg
}

func (e *StepError) Unwrap() error { return e.Err }

// Root is a root filesystem Install made.
type Root struct {
	Dir string
	// Installed are the .debs' packages as dpkg lists them afterwards:
	// name, then version.
	Installed map[string]string
	// Copy and Install are how long the copy of the cached root and apt
	// took.
	Copy, Install time.Duration
}

// Install makes dir (missing or empty) a fresh copy of the cached root
// (built first if needed: Ensure) and installs debs into it as an
// operator would: `apt-get install ./ferry_V_amd64.deb
// ./ferry-criu_V_amd64.deb` inside it (apt pulls what they depend on;
// the default root has all of it already), with the host's /proc, /sys
// and /dev there (Mount) and the maintainer scripts run. The root keeps
// no copy of the .debs. An error is a *StepError naming the step.
func Install(ctx context.Context, o Options, dir string, debs ...string) (Root, error) {
	r := Root{Dir: dir}
	fail := func(step string, err error, out string) (Root, error) {
		return r, &StepError{Root: dir, Step: step, Err: err, Output: out}
	}
	if len(debs) == 0 {
		return fail("check the .debs", errors.New("no .deb given"), "")
	}
	var names []string
	for _, d := range debs {
		out, err := exec.CommandContext(ctx, "dpkg-deb", "--field", d, "Package").CombinedOutput()
		if err != nil {
			return fail("read "+d, err, string(out))
		}
		names = append(names, strings.TrimSpace(string(out)))
	}
	c, err := Ensure(ctx, o)
	if err != nil {
		return fail("build the cached root", err, "")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("make the root's directory", err, "")
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return fail("make the root's directory", errors.Join(err, fmt.Errorf("%s is not empty", dir)), "")
	}
	start := time.Now()
	// Everything, device nodes and file capabilities (xattrs) included,
	// with the owners the archive names.
	out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "--same-owner", "--same-permissions",
		"--xattrs", "--xattrs-include=*", "-C", dir, "-xf", c.Tarball).CombinedOutput()
	if err != nil {
		return fail("copy the cached root "+c.Tarball, err, string(out))
	}
	r.Copy = time.Since(start)
	// As on an installed host: apt resolves the mirror's name, should a
	// dependency be missing from the root.
	if _, err := os.Lstat(filepath.Join(dir, "etc/resolv.conf")); errors.Is(err, fs.ErrNotExist) {
		if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "etc/resolv.conf"), b, 0o644)
		}
	}
	// The .debs go where apt's sandbox user may read them.
	const inside = "/var/cache/ferry-install"
	if err := os.MkdirAll(filepath.Join(dir, inside), 0o755); err != nil {
		return fail("copy the .debs in", err, "")
	}
	args := []string{"env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q"}
	for _, d := range debs {
		p := filepath.Join(inside, filepath.Base(d))
		if err := copyFile(d, filepath.Join(dir, p), 0o644); err != nil {
			return fail("copy the .debs in", err, "")
		}
		args = append(args, p) // a path, not a package's name, to apt
	}
	m, err := Mount(dir, MountOptions{})
	if err != nil {
		return fail("mount the root for apt", err, "")
	}
	start = time.Now()
	var buf bytes.Buffer
	cmd := m.Command(ctx, "", args...)
	w := io.Writer(&buf)
	if o.Log != nil {
		w = io.MultiWriter(&buf, o.Log)
	}
	cmd.Stdout, cmd.Stderr = w, w
	runErr := cmd.Run()
	r.Install = time.Since(start)
	if runErr != nil {
		_ = m.Close()
		return fail("apt-get "+strings.Join(args[3:], " "), runErr, buf.String())
	}
	q := m.Command(ctx, "", append([]string{"dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\\n"}, names...)...)
	qout, qerr := q.CombinedOutput()
	if err := m.Close(); err != nil {
		return fail("unmount the root after apt", err, "")
	}
	if qerr != nil {
		return fail("dpkg-query "+strings.Join(names, " "), qerr, string(qout))
	}
	r.Installed = map[string]string{}
	for line := range strings.Lines(string(qout)) {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "installed" {
			r.Installed[f[0]] = f[1]
		}
	}
	for _, n := range names {
		if _, ok := r.Installed[n]; !ok {
			return fail("check what apt installed", fmt.Errorf("package %s is not installed", n), string(qout)+"\n"+buf.String())
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, inside)); err != nil {
		return fail("remove the .debs' copies", err, "")
	}
	return r, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
