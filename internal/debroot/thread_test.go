package debroot

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// The main goroutine starts on the main thread and stays there (locked
// from init): offMainThread, called from it, must run fn elsewhere.
func init() { runtime.LockOSThread() }

// mainThreadRun is what offMainThread did when called from the main
// thread, before the tests ran (TestMain).
var mainThreadRun struct {
	onMain, ran   bool
	before, after string
	err           error
}

func TestMain(m *testing.M) {
	r := &mainThreadRun
	r.before, _ = os.Readlink("/proc/self/ns/mnt")
	if os.Geteuid() == 0 && unix.Gettid() == unix.Getpid() {
		done := make(chan struct{})
		offMainThread(func() {
			r.ran = true
			r.onMain = unix.Gettid() == unix.Getpid()
			r.err = unix.Unshare(unix.CLONE_NEWNS) // what Mount's thread does
			close(done)
		})
		<-done
		r.after, _ = os.Readlink("/proc/self/ns/mnt")
	}
	os.Exit(m.Run())
}

// A thread Mount leaves in another mount namespace is never the main one,
// whose namespace is the process's in /proc/self: the lab's code reads its
// mounts there (a run of make test lost its Kubernetes lab's teardown to
// this).
func TestOffMainThreadKeepsTheMainThread(t *testing.T) {
	r := mainThreadRun
	if !r.ran {
		t.Skip("needs root, and TestMain on the main thread")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.onMain || r.before != r.after {
		t.Fatalf("fn ran on the main thread: %v; the process's mount namespace %s -> %s", r.onMain, r.before, r.after)
	}
}
