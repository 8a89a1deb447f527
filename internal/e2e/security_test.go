package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// inNetns runs fn with the calling thread in a lab host's network
// namespace, so sockets fn opens live there (lab addresses exist nowhere
// else).
func inNetns(t *testing.T, h *lab.Host, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := netns.GetFromPath(h.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic("cannot return to the original network namespace: " + err.Error())
		}
	}()
	fn()
}

// TestAgentsRefuseUnauthenticatedPeers checks the lab's agents (mutual TLS
// 1.3 with an allow-list) refuse a peer without a certificate, one whose
// certificate another CA signed, and one the CA signed but the destination
// does not list as a source.
func TestAgentsRefuseUnauthenticatedPeers(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	dst := l.Hosts[1].AgentAddr
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A host the lab CA signs, but which no agent lists as a source.
	intruder := t.TempDir()
	if err := pki.Issue(lab.PKIDir, intruder, "h9", []net.IP{net.ParseIP(l.Hosts[2].Addr)}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	notListed, err := transport.LoadSecurity(intruder, "h9", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A host with a certificate from a CA of its own.
	other := t.TempDir()
	if err := pki.NewCA(other, "another CA"); err != nil {
		t.Fatal(err)
	}
	if err := pki.Issue(other, filepath.Join(other, "h1"), "h1", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign, err := transport.LoadSecurity(filepath.Join(other, "h1"), "h1", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A listed host, for contrast: it gets in.
	listed, err := transport.LoadSecurity(l.Hosts[2].TLSDir(), "h3", nil)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		dial func() (*transport.Session, error)
		ok   bool
	}{
		{"no certificate", func() (*transport.Session, error) {
			return transport.Dial(ctx, dst, peerConfig(transport.Hello{Name: "h3", Role: "agent"}, nil))
		}, false},
		{"certificate from another CA", func() (*transport.Session, error) {
			return transport.Dial(ctx, dst, peerConfig(transport.Hello{Name: "h1", Role: "agent"}, foreign))
		}, false},
		{"valid certificate, not an allowed source", func() (*transport.Session, error) {
			return transport.Dial(ctx, dst, peerConfig(transport.Hello{Name: "h9", Role: "agent"}, notListed))
		}, false},
		{"allowed source", func() (*transport.Session, error) {
			return transport.Dial(ctx, "h2@"+dst, peerConfig(transport.Hello{Name: "h3", Role: "agent"}, listed))
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sess *transport.Session
			var err error
			inNetns(t, &l.Hosts[2], func() { sess, err = c.dial() })
			if err == nil {
				// A refused peer may only learn it when the session dies.
				_, err = sess.Open("incoming")
				if err == nil {
					ch, _ := sess.Open("status")
					if ch != nil {
						var v any
						err = ch.Recv(&v)
					}
				}
				sess.Close()
			}
			if c.ok && err != nil && !transport.IsRemote(err) {
				t.Fatalf("allowed source refused: %v", err)
			}
			if !c.ok && err == nil {
				t.Fatal("peer got in")
			}
			if !c.ok {
				t.Logf("refused: %v", err)
			}
		})
	}
	// An operator's certificate asks what the control socket answers, and
	// never offers a migration.
	if err := pki.IssueOperator(lab.PKIDir, filepath.Join(intruder, "ops"), "ops", time.Hour); err != nil {
		t.Fatal(err)
	}
	op, err := transport.LoadOperator(filepath.Join(intruder, "ops"), "ops")
	if err != nil {
		t.Fatal(err)
	}
	inNetns(t, &l.Hosts[2], func() {
		sess, err := transport.Dial(ctx, "h2@"+dst, peerConfig(transport.Hello{Role: "cli"}, op))
		if err != nil {
			t.Fatalf("operator: %v", err)
		}
		defer sess.Close()
		var st engine.Status
		ch, err := sess.Open(engine.ChanStatus)
		if err == nil {
			err = ch.Recv(&st)
			ch.Close()
		}
		if err != nil || st.Host != "h2" {
			t.Errorf("an operator's status request: %+v %v", st, err)
		}
		ch, err = sess.Open(engine.ChanIncoming)
		if err == nil {
			var v any
			err = ch.Recv(&v)
			ch.Close()
		}
		if err == nil || !transport.IsRemote(err) {
			t.Errorf("an operator offered a migration: %v", err)
		}
	})
	log := readLog(t, l.Hosts[1].AgentLog())
	if !strings.Contains(log, "h9") {
		t.Errorf("the destination's log does not name the refused host h9:\n%s", log)
	}
}

// peerConfig is a transport config that says hello and, with sec, proves
// it over TLS.
func peerConfig(hello transport.Hello, sec *transport.Security) *transport.Config {
	c := transport.DefaultConfig()
	c.Hello, c.Security = hello, sec
	return c
}

func readLog(t *testing.T, path string) string {
	t.Helper()
	b, _ := os.ReadFile(path)
	return string(b)
}
