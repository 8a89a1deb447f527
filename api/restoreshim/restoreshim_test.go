package restoreshim

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestKeyDirFitsASocketAddress(t *testing.T) {
	id := strings.Repeat("0123456789abcdef", 4) // a containerd ID
	dir := KeyDir("/var/lib/ferry/lab/kube/h1/restore", id)
	if sock := filepath.Join(dir, SocketFile); len(sock) > 107 {
		t.Errorf("socket %s: %d bytes", sock, len(sock))
	}
	if KeyDir("/d", id) == KeyDir("/d", id[:63]+"0") {
		t.Error("two IDs share a directory")
	}
	if got := KeyDir("/d", "short-key"); got != "/d/short-key" {
		t.Errorf("short key: %s", got)
	}
	for _, bad := range []string{"", ".hidden", "a/b", "../x", strings.Repeat("a", 129)} {
		if CheckKey(bad) == nil {
			t.Errorf("CheckKey(%q) accepted", bad)
		}
	}
}

func TestAskAndAnswer(t *testing.T) {
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Answer(b, time.Second, func(r Request) Reply {
			if r.CRIUConfig != "/c.conf" {
				return Reply{Error: "bad config " + r.CRIUConfig}
			}
			return Reply{PID: 42}
		})
	}()
	rep, err := Ask(a, Request{CRIUConfig: "/c.conf"}, time.Second)
	if err != nil || rep.PID != 42 || rep.Error != "" {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
