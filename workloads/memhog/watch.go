package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// watch is an inotify watch on a file; VERIFY writes the file and checks
// that the watch still reports it (CRIU restores a watch by the file's
// path, which must be found at the dump).
type watch struct {
	path string
	fd   int
	mu   sync.Mutex
}

func newWatch(path string) (*watch, error) {
	if err := os.WriteFile(path, []byte("watched\n"), 0o644); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	return &watch{path: path, fd: fd}, nil
}

// check writes the file and waits up to a second for the watch's event.
func (w *watch) check() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf := make([]byte, 4096)
	for { // what is queued already
		if n, _ := unix.Read(w.fd, buf); n <= 0 {
			break
		}
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return false
	}
	_, err = f.WriteString("checked\n")
	f.Close()
	if err != nil {
		return false
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, _ := unix.Read(w.fd, buf)
		if n >= unix.SizeofInotifyEvent {
			return true
		}
	}
	return false
}
