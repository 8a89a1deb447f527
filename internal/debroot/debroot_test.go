package debroot

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/aptsources"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/tail"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The key is the suite, mmdebstrap's options and the package list in
// any order; not the mirror, nor where the cache lives.
func TestKey(t *testing.T) {
	a := Options{Packages: []string{"runc", "iproute2"}}
	same := []Options{
		{Packages: []string{"iproute2", "runc", "runc"}},
		{Packages: []string{"runc", "iproute2"}, Mirror: "http://elsewhere.example/debian", CacheDir: "/elsewhere"},
		{Packages: []string{"runc", "iproute2"}, Suite: DefaultSuite},
	}
	for _, b := range same {
		if a.Key() != b.Key() {
			t.Errorf("%+v and %+v have different keys", a, b)
		}
	}
	other := []Options{
		{Packages: []string{"runc"}},
		{Packages: []string{"runc", "iproute2"}, Suite: "trixie"},
		{},
	}
	for _, b := range other {
		if a.Key() == b.Key() {
			t.Errorf("%+v and %+v share a key", a, b)
		}
	}
	if want := filepath.Join(DefaultCacheDir(), "debroot-bookworm-"+a.Key()+".tar"); a.Path() != want {
		t.Errorf("Path %s, want %s", a.Path(), want)
	}
}

// ExecStart reads the unit the way systemd does, the real one included.
func TestExecStart(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lib/systemd/system/a.service", "[Unit]\nDescription=x\n\n[Service]\n# comment\nExecStart=-/usr/bin/a --x 'two words' \"q\\\"d\" \\\n  --next\n")
	argv, err := ExecStart(root, "a.service")
	if want := []string{"/usr/bin/a", "--x", "two words", `q"d`, "--next"}; err != nil || !slices.Equal(argv, want) {
		t.Errorf("ExecStart = %q, %v; want %q", argv, err, want)
	}
	// The administrator's copy wins over the package's.
	write("etc/systemd/system/a.service", "[Service]\nExecStart=/usr/local/bin/a\n")
	if argv, err := ExecStart(root, "a.service"); err != nil || !slices.Equal(argv, []string{"/usr/local/bin/a"}) {
		t.Errorf("with an override: %q, %v", argv, err)
	}
	for name, text := range map[string]string{
		"spec.service":  "[Service]\nExecStart=/usr/bin/a %i\n",
		"var.service":   "[Service]\nExecStart=/usr/bin/a $X\n",
		"rel.service":   "[Service]\nExecStart=a\n",
		"two.service":   "[Service]\nExecStart=/a\nExecStart=/b\n",
		"quote.service": "[Service]\nExecStart=/a 'open\n",
	} {
		write("lib/systemd/system/"+name, text)
		if argv, err := ExecStart(root, name); err == nil {
			t.Errorf("%s: ExecStart = %q, want an error", name, argv)
		}
	}
	if _, err := ExecStart(root, "none.service"); err == nil {
		t.Error("a missing unit gave no error")
	}
	// The unit the package installs.
	repo, err := FindRepo()
	if err != nil {
		t.Fatal(err)
	}
	write("lib/systemd/system/ferry-agent.service", readFile(t, filepath.Join(repo, "packaging/systemd/ferry-agent.service")))
	argv, err = ExecStart(root, "ferry-agent.service")
	if err != nil || len(argv) < 2 || argv[0] != "/usr/bin/ferry" || argv[1] != "agent" {
		t.Errorf("ferry-agent.service: %q, %v", argv, err)
	}
	u, err := ReadUnit(filepath.Join(repo, "packaging/systemd/run-criu.mount"))
	if err != nil {
		t.Fatal(err)
	}
	flags, data := mountOptions(u.Get("Mount", "Options"))
	if u.Get("Mount", "Where") != "/run/criu" || u.Get("Mount", "Type") != "tmpfs" ||
		flags != syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC || data != "mode=0700,size=4m" {
		t.Errorf("run-criu.mount: %v, flags %#x, data %q", u["Mount"], flags, data)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// needRoots skips unless this machine can build (or has cached) the root
// and can build the .debs.
func needRoots(t *testing.T) {
	t.Helper()
	testroot.Require(t, "needs root: the root keeps its owners, and is mounted in a namespace of its own")
	for _, tool := range []string{"tar", "dpkg-deb", "make", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP (not a pass): needs %s: %v", tool, err)
		}
	}
	if _, err := os.Stat((Options{}).Path()); err == nil {
		return
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("SKIP (not a pass): no cached root and no mmdebstrap to build it (make setup)")
	}
	mirror, _, err := aptsources.Find(aptsources.System)
	if err == nil {
		err = aptsources.Reachable(context.Background(), mirror, DefaultSuite, 5*time.Second)
	}
	if err != nil {
		t.Skipf("SKIP (not a pass): no cached root, and the Debian mirror is out of reach: %v", err)
	}
}

// The packages, installed into a clean Debian 12 by apt: ferry runs, its
// CRIU is ferry's, the unit's command is there and the unit verifies,
// and an agent started exactly as the unit says serves, after the
// certificate steps of docs/DEPLOY.md.
func TestInstalledPackages(t *testing.T) {
	needRoots(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// make test's ferry (its bin) is reused; alone, the test links one.
	bin := t.TempDir()
	if b := os.Getenv("FERRY_BIN"); b != "" {
		bin = filepath.Dir(b)
	}
	debs, err := BuildDebs(ctx, DebsOptions{Bin: bin, Dist: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s and %s in %.1f s", filepath.Base(debs.Ferry), filepath.Base(debs.CRIU), debs.Took.Seconds())

	c, err := Ensure(ctx, Options{Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Built {
		t.Logf("built the cached root %s in %.1f s", c.Tarball, c.Took.Seconds())
	}
	dir := filepath.Join(t.TempDir(), "root")
	t.Cleanup(func() {
		// No mount of the root's is on the host: nothing to detach.
		if left, err := mounts.Under(dir); err != nil || len(left) > 0 {
			t.Errorf("mounts left below %s on the host: %v %v", dir, left, err)
		}
	})
	start := time.Now()
	r, err := Install(ctx, Options{}, dir, debs.Files()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("installed %v: the root copied in %.1f s, apt %.1f s, %.1f s in all",
		r.Installed, r.Copy.Seconds(), r.Install.Seconds(), time.Since(start).Seconds())

	m, err := Mount(dir, MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if isMountPoint(m.NSFile) {
			t.Errorf("%s still mounted after Close", m.NSFile)
		}
	})
	run := func(netns string, argv ...string) string {
		t.Helper()
		out, err := m.Command(ctx, netns, argv...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s in the root: %v\n%s", strings.Join(argv, " "), err, out)
		}
		return string(out)
	}

	if out := run("", "ferry", "version"); !strings.Contains(out, "ferry") {
		t.Errorf("ferry version: %q", out)
	}
	if out := run("", "/usr/libexec/ferry/criu", "--version"); !strings.Contains(out, "ferry-patches:") {
		t.Errorf("ferry-criu's criu --version names no ferry patches:\n%s", out)
	}
	// CRIU's own look at the kernel, from inside the root.
	if out := run("", "/usr/libexec/ferry/criu", "check"); !strings.Contains(out, "Looks good") {
		t.Errorf("criu check:\n%s", out)
	}
	// Nothing of the host's CRIU or ferry leaks in.
	if out := run("", "sh", "-c", "command -v criu; ls /usr/local/sbin; echo $PATH"); strings.Contains(out, "criu\n") {
		t.Errorf("a criu on the root's PATH: %q", out)
	}

	argv, err := ExecStart(dir, "ferry-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, argv[0])); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("the unit's ExecStart %s is not an executable in the root: %v", argv[0], err)
	}
	// systemd checks the units as installed (it need not run: verify
	// loads the unit files and finds their commands): the root's own
	// systemd (Debian 12's, which the units will meet), and the host's
	// looking into the root (--root), where the host has one.
	units := []string{"ferry-agent.service", "run-criu.mount"}
	verify := m.Command(ctx, "", append([]string{"systemd-analyze", "verify"}, units...)...)
	if out, err := verify.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify in the root: %v\n%s", err, out)
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		verify = exec.CommandContext(ctx, "systemd-analyze", append([]string{"verify", "--root=" + dir}, units...)...)
		if out, err := verify.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify --root=%s: %v\n%s", dir, err, out)
		}
	}

	checkpointRestore(ctx, t, m, run)
	startAgent(ctx, t, m, run)
}

// checkpointRestore has the root's runc and ferry-criu checkpoint a
// busybox container and restore it: CRIU works from such a root (its
// mount namespace's root is the root's, as CRIU needs).
func checkpointRestore(ctx context.Context, t *testing.T, m *Mounted, run func(string, ...string) string) {
	t.Helper()
	const busybox = "/bin/busybox"
	if err := isStatic(busybox); err != nil {
		t.Logf("no checkpoint in the root: needs a static %s (busybox-static): %v", busybox, err)
		return
	}
	bundle := filepath.Join(m.Root, "srv/bundle")
	for _, d := range []string{"bin", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(bundle, "rootfs", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyFile(busybox, filepath.Join(bundle, "rootfs/bin/busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A cgroup of the test's own, not the lab's nor the default /ID.
	id := fmt.Sprintf("debroot-%d", os.Getpid())
	cgroup := fmt.Sprintf("/ferry-debroot-test-%d/%s", os.Getpid(), id)
	run("", "sh", "-c", `cd /srv/bundle && runc spec && sed -i \
		-e 's/"terminal": true/"terminal": false/' \
		-e 's#"sh"#"/bin/busybox", "sleep", "1000"#' \
		-e 's#"linux": {#"linux": {\n\t\t"cgroupsPath": "`+cgroup+`",#' config.json`)
	t.Cleanup(func() {
		_ = m.Command(ctx, "", "runc", "delete", "-f", id).Run()
		for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd", "unified"} {
			_ = os.Remove(filepath.Join("/sys/fs/cgroup", c, filepath.Dir(cgroup)))
		}
	})
	// stdio /dev/null: a file of the caller's would be outside the
	// container, which CRIU refuses to dump.
	start := time.Now()
	run("", "sh", "-c", "cd /srv/bundle && runc run -d "+id+" </dev/null >/dev/null 2>&1")
	// The agent puts its CRIU's directory on runc's PATH; here runc is
	// told.
	run("", "runc", "--criu", "/usr/libexec/ferry/criu", "checkpoint", "--image-path", "/srv/images", "--work-path", "/srv/images", id)
	run("", "sh", "-c", "cd /srv/bundle && runc --criu /usr/libexec/ferry/criu restore -d --image-path /srv/images --work-path /srv/images "+id+" </dev/null >/dev/null 2>&1")
	if out := run("", "runc", "state", id); !strings.Contains(out, `"running"`) {
		t.Errorf("after the restore: %s", out)
	}
	t.Logf("a busybox container run, checkpointed and restored in the root in %.2f s", time.Since(start).Seconds())
	run("", "runc", "delete", "-f", id)
}

// startAgent follows docs/DEPLOY.md's certificate and configuration
// steps inside the root, starts the agent as the unit's ExecStart says in
// a network namespace of the test's own, asks it for its migrations with
// the CLI as an operator on the host would, and stops it as systemd
// would (SIGTERM).
func startAgent(ctx context.Context, t *testing.T, m *Mounted, run func(string, ...string) string) {
	netns := fmt.Sprintf("ferry-debroot-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", netns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", netns, err, out)
		}
	})
	nsPath := "/run/netns/" + netns
	run(nsPath, "ip", "link", "set", "lo", "up")
	// Named after the root was mounted, it is there inside too (the
	// agent's netns = "/var/run/netns/..." finds it).
	run("", "ip", "-n", netns, "link", "show", "lo")

	// docs/DEPLOY.md, section 2 and 3.
	run("", "ferry", "certs", "init", "--dir", "/root/ferry-ca")
	run("", "ferry", "certs", "issue", "--dir", "/root/ferry-ca", "--host", "node1", "--ip", "127.0.0.1")
	run("", "sh", "-c", "mkdir -p /etc/ferry && cp -rp /root/ferry-ca/node1 /etc/ferry/pki")
	// The package's agent.toml is node1's as section 3 has it edited
	// (name node1, tls-dir /etc/ferry/pki, allow node2), listening on
	// 0.0.0.0:7070: the test's own namespace. It is used as installed.
	conf := readFile(t, filepath.Join(m.Root, "etc/ferry/agent.toml"))
	for _, want := range []string{`name = "node1"`, `tls-dir = "/etc/ferry/pki"`, `listen = ["0.0.0.0:7070"]`} {
		if !strings.Contains(conf, want+"\n") {
			t.Fatalf("the installed agent.toml lacks %s:\n%s", want, conf)
		}
	}

	logPath := filepath.Join(t.TempDir(), "agent.log")
	p, err := m.StartService("ferry-agent.service", nsPath, logPath)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
			<-p.Exited
		}
	})
	sock := m.HostPath("/run/ferry/agent.sock")
	err = p.AwaitReady(ctx, 30*time.Second, 50*time.Millisecond, func(context.Context) error {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("the agent did not serve %s: %v\n%s", sock, err, tail.File(logPath, 20))
	}
	// It listens where agent.toml says, in its namespace.
	if out := run(nsPath, "ss", "-Htln", "sport", "= :7070"); !strings.Contains(out, ":7070") {
		t.Errorf("nothing listens on port 7070 in %s: %q", netns, out)
	}
	t.Logf("ferry ps --all in the root: %s", strings.TrimSpace(run(nsPath, "ferry", "ps", "--all")))
	if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.Exited:
		stopped = true
		if err != nil {
			t.Errorf("the agent ended with %v on SIGTERM:\n%s", err, tail.File(logPath, 20))
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the agent did not end within 30 s of SIGTERM:\n%s", tail.File(logPath, 20))
	}
	if pids, err := m.Processes(); err != nil || len(pids) > 0 {
		t.Errorf("processes left in the root: %v %v", pids, err)
	}
	t.Logf("the agent's log:\n%s", tail.File(logPath, 12))
}

// isStatic says why path is not a static executable, if it is not.
func isStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked")
		}
	}
	return nil
}

// testLog writes mmdebstrap's output into the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// An install apt refuses says the step and apt's reason; a mounted root
// sees its binds inside it (symbolic links resolved inside, not on the
// host), one mount at a time, and Close ends what runs there.
func TestInstallFailureAndMount(t *testing.T) {
	needRoots(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pkg := filepath.Join(t.TempDir(), "bad")
	if err := os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	control := "Package: ferry-debroot-bad\nVersion: 1\nArchitecture: all\nMaintainer: ferry <ferry@example.org>\n" +
		"Depends: ferry-no-such-package\nDescription: a package apt cannot install\n"
	if err := os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	deb := pkg + ".deb"
	if out, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "root")
	_, err := Install(ctx, Options{}, dir, deb)
	var se *StepError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Step, "apt-get install") || !strings.Contains(se.Output, "ferry-no-such-package") {
		t.Fatalf("Install of a .deb whose dependency is missing: %v", err)
	}
	t.Logf("as it should: %v", err)
	if left, err := mounts.Under(dir); err != nil || len(left) > 0 {
		t.Errorf("mounts left below %s on the host: %v %v", dir, left, err)
	}

	// The copy is there: mount it with binds. Debian's /var/run is a
	// link to /run, which must resolve inside the root.
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "x"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/ferry-debroot-bound"); err == nil {
		t.Fatal("/run/ferry-debroot-bound exists on the host before the test")
	}
	m, err := Mount(dir, MountOptions{Binds: []Bind{
		{Source: shared, Target: "/var/run/ferry-debroot-bound"},
		{Source: filepath.Join(shared, "x"), Target: "/etc/bound-x", ReadOnly: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	run := func(argv ...string) (string, error) {
		out, err := m.Command(ctx, "", argv...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("cat", "/run/ferry-debroot-bound/x", "/etc/bound-x"); err != nil || out != "from the host\nfrom the host\n" {
		t.Errorf("the binds inside: %q %v", out, err)
	}
	if _, err := os.Stat("/run/ferry-debroot-bound"); err == nil {
		t.Error("a bind's target resolved on the host (/run/ferry-debroot-bound)")
	}
	if out, err := run("sh", "-c", "echo x > /etc/bound-x"); err == nil {
		t.Errorf("wrote a read-only bind: %s", out)
	}
	if out, err := run("sh", "-c", "echo $PATH; env | wc -l"); err != nil || out != ServicePath+"\n2\n" {
		t.Errorf("the environment inside: %q %v (want PATH and PWD alone)", out, err)
	}
	if _, err := Mount(dir, MountOptions{}); err == nil || !strings.Contains(err.Error(), "already mounted") {
		t.Errorf("a second Mount of the same root: %v", err)
	}

	// Another process's handle ends it; what runs inside is ended too.
	a, err := Attach(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Start("", filepath.Join(t.TempDir(), "sleep.log"), "sleep", "300")
	if err != nil {
		t.Fatal(err)
	}
	// It is nsenter in the host's namespace until it has entered.
	var pids []int
	for end := time.Now().Add(5 * time.Second); !slices.Contains(pids, p.PID) && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		pids, err = a.Processes()
	}
	if err != nil || !slices.Contains(pids, p.PID) {
		t.Errorf("Processes = %v, %v; want %d among them", pids, err, p.PID)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited:
	case <-time.After(10 * time.Second):
		t.Error("the process inside outlived Close")
	}
	if isMountPoint(m.NSFile) {
		t.Errorf("%s still mounted after Close", m.NSFile)
	}
	if err := m.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
