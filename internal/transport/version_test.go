package transport

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// A version mismatch says which side runs the older ferry and where to
// upgrade it.
func TestVersionErrorNamesTheOlderSide(t *testing.T) {
	older := (&VersionError{Peer: ProtocolVersion - 1, PeerName: "node1", LocalName: "node2"}).Error()
	for _, want := range []string{
		fmt.Sprintf("peer speaks protocol version %d, this ferry speaks %d", ProtocolVersion-1, ProtocolVersion),
		"node1 runs an older ferry; upgrade ferry on node1",
	} {
		if !strings.Contains(older, want) {
			t.Errorf("%q does not say %q", older, want)
		}
	}
	newer := (&VersionError{Peer: ProtocolVersion + 1, PeerName: "node1", LocalName: "node2"}).Error()
	if !strings.Contains(newer, "this ferry is older than node1's; upgrade ferry on this host (node2)") {
		t.Errorf("%q does not say to upgrade this host", newer)
	}
	if s := (&VersionError{Peer: ProtocolVersion - 1}).Error(); !strings.Contains(s, "the peer runs an older ferry; upgrade ferry on the peer") {
		t.Errorf("nameless: %q", s)
	}
}

// An agent of the previous protocol version dials this one: its Hello's
// frame carries the old version. The agent refuses it naming the caller
// as the one to upgrade, and answers with its own Hello, so that the
// older side can say what is wrong too instead of seeing the connection
// drop.
func TestAcceptRefusesAnOlderAgent(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	hello, err := json.Marshal(Hello{Version: ProtocolVersion - 1, Name: "node1", Role: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	old := script(control(hello))
	old[3] = ProtocolVersion - 1
	errc := make(chan error, 1)
	go func() {
		_, err := acceptHandshake(b, Hello{Name: "node2", Role: "agent"}, func(Hello) error { return nil })
		errc <- err
	}()
	go func() { _, _ = a.Write(old) }()
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := ReadFrame(a, nil)
	if err != nil {
		t.Fatalf("the older side heard no Hello back: %v", err)
	}
	var answer Hello
	if err := json.Unmarshal(f.Payload, &answer); err != nil || answer.Version != ProtocolVersion || answer.Name != "node2" {
		t.Errorf("answer %+v (%v)", answer, err)
	}
	err = <-errc
	var v *VersionError
	if !errors.As(err, &v) || v.Peer != ProtocolVersion-1 || v.LocalName != "node2" {
		t.Fatalf("accept: %v", err)
	}
	if !strings.Contains(err.Error(), "runs an older ferry; upgrade ferry on") {
		t.Errorf("accept's error %q does not say which side to upgrade", err)
	}
}
