package nodens

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The test binary plays a pod's agent: started by the test (the shim) in
// a mount namespace of its own, where a tmpfs holds its "Secret".
const childEnv = "NODENS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		os.Exit(m.Run())
	}
	fs := flag.NewFlagSet("child", flag.ExitOnError)
	secret := fs.String("secret", "", "")
	leave := fs.String("leave", "", "")
	_ = fs.Parse(os.Args[1:])
	if *leave != "" {
		if err := LeavePod(*leave); err != nil {
			fmt.Println("leave:", err)
			os.Exit(2)
		}
		b, _ := os.ReadFile("/proc/self/cgroup")
		fmt.Print(string(b))
		os.Exit(0)
	}
	if err := Enter(os.Args[1:], Paths{"secret": *secret}); err != nil {
		fmt.Println("enter:", err)
		os.Exit(2)
	}
	// Here after the re-execution (or at once, already there): report the
	// namespace and what the kept path holds.
	mnt, _ := os.Readlink("/proc/self/ns/mnt")
	data, err := os.ReadFile(filepath.Join(*secret, "key"))
	fmt.Printf("mnt=%s secret=%s data=%q err=%v\n", mnt, *secret, data, err)
	os.Exit(0)
}

// TestEnterJoinsTheParentsMountNamespace: a process in a mount namespace
// of its own ends in its parent's, with the path it kept from its own
// (a tmpfs mounted only there) still readable.
func TestEnterJoinsTheParentsMountNamespace(t *testing.T) {
	testroot.Require(t, "setns into a mount namespace")
	// The child's own namespace gets a tmpfs on a directory that, in ours,
	// stays an empty directory.
	dir := t.TempDir()
	script := fmt.Sprintf("mount --make-rprivate / && mount -t tmpfs none %s && echo -n s3cret > %s/key && exec %s --secret %s",
		dir, dir, os.Args[0], dir)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// unshare execs sh, which execs the test binary: its parent is us.
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(out.String())
	if !strings.HasPrefix(got, "mnt="+ours+" ") {
		t.Fatalf("child ended in another mount namespace than its parent's (%s): %s", ours, got)
	}
	if !strings.Contains(got, "secret=/proc/self/fd/") || !strings.Contains(got, `data="s3cret" err=<nil>`) {
		t.Fatalf("the kept path was not handed over as /proc/self/fd/N, or lost its contents: %s", got)
	}
	// And in ours, the directory is empty: the child read its own tmpfs.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%s is not empty here: the tmpfs leaked into the test's namespace", dir)
	}
}

// TestEnterAlreadyThere: in its parent's namespace already, Enter returns
// and changes nothing.
func TestEnterAlreadyThere(t *testing.T) {
	testroot.Require(t, "read a parent's mount namespace")
	if err := Enter(nil, Paths{"x": "/nonexistent"}); err != nil {
		t.Fatal(err)
	}
}

// TestLeavePod: the caller (a child here) moves into the cgroup, made in
// every hierarchy, and its own cgroup file says so.
func TestLeavePod(t *testing.T) {
	testroot.Require(t, "move into a cgroup")
	rel := fmt.Sprintf("ferry-nodens-test-%d", os.Getpid())
	cmd := exec.Command(os.Args[0], "--leave", rel)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	// The child has exited: its cgroup is empty and can go.
	if rerr := cgroups.Remove(rel); rerr != nil {
		t.Errorf("remove the test's cgroup: %v", rerr)
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || len(lines) != len(cgroups.Hierarchies(cgroups.Root)) {
		t.Fatalf("want one line per hierarchy (%d):\n%s", len(cgroups.Hierarchies(cgroups.Root)), out)
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, ":/"+rel) {
			t.Fatalf("not moved into %s in every hierarchy:\n%s", rel, out)
		}
	}
}
