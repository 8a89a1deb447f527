package runc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The container's /dev is a tmpfs CRIU archives at the dump and extracts
// at the restore: ferry's CRIU itself when the tmpfs is small, tar
// otherwise (scripts/criu-patches/0012). Either way what the container
// made there comes back as it was: kinds, owners, modes (set-user-ID too),
// times, contents, device numbers, links.
func TestDevComesBackAsItWas(t *testing.T) {
	const made = "mkdir -p /dev/ferry/deep; mkfifo /dev/ferry/fifo; echo kept > /dev/ferry/note; " +
		"chown 1000:100 /dev/ferry/note; chmod 4640 /dev/ferry/note; : > /dev/ferry/empty; " +
		"mknod /dev/ferry/null2 c 1 3; ln -s ../../null /dev/ferry/deep/null; chmod 700 /dev/ferry/deep; "
	const listed = "touch -d '2020-01-02 03:04:05' /dev/ferry/note /dev/ferry/fifo; " +
		"touch -d '2021-02-03 04:05:06' /dev/ferry/deep /dev/ferry; " +
		"i=0; while true; do i=$((i+1)); ls -lanR --full-time /dev/ferry /dev/null /dev/zero /dev/fd /dev/ptmx > /l.new; " +
		"cat /dev/ferry/note >> /l.new; mv /l.new /l; echo $i > /c.new; mv /c.new /c; sleep 0.05; done"
	for _, tc := range []struct {
		name, more string
		byCRIU     bool
	}{
		{"small", "", true},
		// A hard link and a file over 64 KiB are tar's to archive.
		{"tar's", "ln /dev/ferry/note /dev/ferry/hard; head -c 100000 /dev/urandom > /dev/ferry/big; ", false},
	} {
		t.Run(tc.name, func(t *testing.T) { devMoves(t, made+tc.more+listed, tc.byCRIU) })
	}
}

func devMoves(t *testing.T, script string, byCRIU bool) {
	h := newGateHostsRunning(t, script)
	counted(t, filepath.Join(h.rootfs, "c"), []byte("0")) // /dev made, listed
	dir := t.TempDir()
	dump := h.dump(t, filepath.Join(dir, "dump"))
	was, _ := os.ReadFile(filepath.Join(h.rootfs, "c"))
	before, err := os.ReadFile(filepath.Join(h.rootfs, "l"))
	if err != nil || !strings.Contains(string(before), "kept") {
		t.Fatalf("the container's listing before the dump: %q, %v", before, err)
	}
	log, err := os.ReadFile(filepath.Join(dir, "dump", "work", "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(string(log), "tmpfs archived by criu"); got != byCRIU {
		t.Errorf("CRIU archived /dev itself: %v, want %v", got, byCRIU)
	}

	tg, o := h.prepare(t, filepath.Join(dir, "work"))
	r, err := tg.StartRestore(o)
	if err != nil {
		t.Fatal(err)
	}
	atGate(t, r)
	copyImages(t, dump, o.ImagesDir)
	if _, err := r.Go(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Twice: the first count after the restore may come before the
	// listing's next pass.
	counted(t, filepath.Join(tg.RootfsDir(), "c"), was)
	now, _ := os.ReadFile(filepath.Join(tg.RootfsDir(), "c"))
	counted(t, filepath.Join(tg.RootfsDir(), "c"), now)
	after, err := os.ReadFile(filepath.Join(tg.RootfsDir(), "l"))
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Errorf("/dev after the move:\n%s\nbefore:\n%s", after, before)
	}
	if err := tg.Discard(context.Background()); err != nil {
		t.Fatal(err)
	}
}
