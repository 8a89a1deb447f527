package main

import (
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/preflight"
)

// ferry check --peer shows both sides' versions, and which way a
// migration would be refused for a CRIU's patches.
func TestCheckPeerText(t *testing.T) {
	all := criu.ParsePatches("ferry-patches: 0001,0002,0003,0004,0005,0006,0007,0008,0009,0010,0011,0012,0013,0014,0015,0016")
	here := preflight.Report{CriuPath: "/usr/local/sbin/criu", CriuVersion: "4.2.1", CriuPatches: all}
	for _, c := range []struct {
		name string
		pc   *peerCheck
		want []string
	}{
		{name: "an older agent", pc: &peerCheck{OK: true, Status: &api.Status{Host: "node2"}},
			want: []string{"this host        ferry ", "node2            an older ferry that does not tell its versions: upgrade ferry on node2"}},
		{name: "another protocol", pc: &peerCheck{Host: "node2@10.0.0.2:7070", Error: "handshake with 10.0.0.2:7070: transport: peer speaks protocol version 5, this ferry speaks 6: 10.0.0.2:7070 runs an older ferry; upgrade ferry on 10.0.0.2:7070 to this one's version or later"},
			want: []string{"✗ node2@10.0.0.2:7070", "upgrade ferry on 10.0.0.2:7070"}},
		{name: "a stock CRIU there", pc: &peerCheck{OK: true, Status: &api.Status{Host: "node2", Ferry: "v1.2.0", Protocol: 6,
			CRIU: &api.CRIUStatus{Path: "/usr/sbin/criu", Version: "4.2.1"}}},
			want: []string{"node2            ferry v1.2.0, protocol 6, CRIU /usr/sbin/criu 4.2.1 (ferry patches: none)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			c.pc.text(&b, here)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
	// The directions, as checkPeer fills them.
	pc := &peerCheck{OK: true, Host: "node2", Status: &api.Status{Host: "node2", Ferry: "v1", Protocol: 6, CRIU: &api.CRIUStatus{Version: "4.2.1"}}}
	if m := criu.Unreadable(here.CriuPatches, nil); len(m) > 0 {
		pc.To = "refused: node2's CRIU lacks " + criu.IDs(m)
	}
	var b strings.Builder
	pc.text(&b, here)
	if !strings.Contains(b.String(), "! to node2") || !strings.Contains(b.String(), "0010 (tmpfs: archive without gzip)") {
		t.Errorf("no refusal to node2:\n%s", b.String())
	}
}
