package client

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/pki"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// fakeAgent serves sessions on a unix socket with handle, which gets
// each channel the client opens; it returns the client's endpoint.
func fakeAgent(t *testing.T, handle func(*transport.Channel)) Endpoint {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	serve(t, nil, sock, handle)
	return Socket(sock)
}

// serve is host h1's agent on addr (a TCP address over TLS with sec),
// each channel to handle; it returns the address it listens on.
func serve(t *testing.T, sec *transport.Security, addr string, handle func(*transport.Channel)) string {
	t.Helper()
	c := transport.DefaultConfig()
	c.Hello = transport.Hello{Name: "h1", Role: "agent"}
	c.Security = sec
	srv, err := transport.NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := srv.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				sess, err := srv.Accept(conn)
				if err != nil {
					return
				}
				defer sess.Close()
				for {
					ch, err := sess.Accept()
					if err != nil {
						return
					}
					go handle(ch)
				}
			}()
		}
	}()
	return l.Addr().String()
}

// A program away from the agent's host reaches it with what this package
// exports alone: the operator's certificate (LoadOperator) and the
// agent's address and name; a host's certificate is no operator's.
func TestRemoteAgentWithAnOperatorsCertificate(t *testing.T) {
	dir := t.TempDir()
	if err := pki.NewCA(dir, ""); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		pki.Issue(dir, filepath.Join(dir, "h1"), "h1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil, time.Hour),
		pki.IssueOperator(dir, filepath.Join(dir, "ops"), "alice", time.Hour),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sec, err := transport.LoadSecurity(filepath.Join(dir, "h1"), "h1", []string{"h2"})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, sec, "127.0.0.1:0", func(ch *transport.Channel) {
		defer ch.Close()
		_ = ch.Send(api.Status{Host: "h1"})
	})
	if _, err := LoadOperator(filepath.Join(dir, "h1"), "h1"); err == nil {
		t.Error("a host's certificate loaded as an operator's")
	}
	op, err := LoadOperator(filepath.Join(dir, "ops"), "alice")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if st, err := Status(ctx, Endpoint{Addr: addr, Name: "h1", Operator: op}); err != nil || st.Host != "h1" {
		t.Errorf("status of h1@%s: %+v, %v", addr, st, err)
	}
	if _, err := Status(ctx, Endpoint{Addr: addr, Name: "h2", Operator: op}); err == nil {
		t.Error("h1 passed for h2")
	}
}

// A migration is followed from its acceptance, through its progress, to
// its report; the request reaches the agent as sent.
func TestMigrateFollowsTheJob(t *testing.T) {
	got := make(chan api.Request, 1)
	ep := fakeAgent(t, func(ch *transport.Channel) {
		defer ch.Close()
		if ch.Kind != api.ChanMigrate {
			_ = ch.Fail(errors.New("unexpected " + ch.Kind))
			return
		}
		var req api.Request
		if err := ch.Recv(&req); err != nil {
			return
		}
		got <- req
		_ = ch.Send(api.Event{Job: &api.JobRef{ID: "0123456789ab"}})
		_ = ch.Send(api.Event{Progress: &api.Progress{Phase: "rounds", Rounds: 2}})
		_ = ch.Send(api.Event{Report: &api.Report{ID: "0123456789ab", OK: true, Container: req.Container}})
	})
	var id string
	var phases []string
	rep, err := MigrateJob(context.Background(), ep, api.Request{ID: "0123456789ab", Container: "web", To: "h2", Mode: api.ModePrecopy},
		func(s string) { id = s }, func(p api.Progress) { phases = append(phases, p.Phase) })
	if err != nil || !rep.OK || rep.Container != "web" {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if r := <-got; r.ID != "0123456789ab" || r.Container != "web" || r.Mode != api.ModePrecopy {
		t.Errorf("the agent got %+v", r)
	}
	if id != "0123456789ab" || strings.Join(phases, ",") != "rounds" {
		t.Errorf("accepted %q, progress %v", id, phases)
	}
}

// An agent that goes away mid-migration is reported as lost, saying the
// container may be at either host; one that refuses says why.
func TestMigrateLostOrRefused(t *testing.T) {
	ep := fakeAgent(t, func(ch *transport.Channel) {
		var req api.Request
		_ = ch.Recv(&req)
		if req.Container == "refused" {
			_ = ch.Fail(errors.New("no container named refused"))
			return
		}
		_ = ch.Send(api.Event{Job: &api.JobRef{ID: "0123456789ab"}})
		ch.Close() // gone without a report
	})
	_, err := Migrate(context.Background(), ep, api.Request{Container: "web", To: "h2"}, nil)
	if err == nil || !strings.Contains(err.Error(), "may be at either host") {
		t.Errorf("an agent gone mid-migration: %v", err)
	}
	_, err = Migrate(context.Background(), ep, api.Request{Container: "refused", To: "h2"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no container named refused") {
		t.Errorf("a refusal: %v", err)
	}
}

// The one-reply requests send what the agent expects and return its
// answer; a cancelled context stops a follow without stopping the agent.
func TestAskAndCancelledFollow(t *testing.T) {
	ep := fakeAgent(t, func(ch *transport.Channel) {
		defer ch.Close()
		switch ch.Kind {
		case api.ChanJobs:
			var q api.JobsQuery
			_ = ch.Recv(&q)
			_ = ch.Send([]api.Job{{ID: "0123456789ab", Container: map[bool]string{true: "all", false: "running"}[q.All]}})
		case api.ChanCancel:
			var r api.JobRef
			_ = ch.Recv(&r)
			_ = ch.Send(api.CancelReply{Cancelled: r.ID == "0123456789ab"})
		case api.ChanStatus:
			_ = ch.Send(api.Status{Host: "h1"})
		case api.ChanWait:
			var r api.JobRef
			_ = ch.Recv(&r)
			time.Sleep(time.Minute) // never ends on its own
		}
	})
	ctx := context.Background()
	if js, err := Jobs(ctx, ep, true); err != nil || len(js) != 1 || js[0].Container != "all" {
		t.Errorf("jobs: %+v %v", js, err)
	}
	if r, err := Cancel(ctx, ep, "0123456789ab"); err != nil || !r.Cancelled {
		t.Errorf("cancel: %+v %v", r, err)
	}
	if st, err := Status(ctx, ep); err != nil || st.Host != "h1" {
		t.Errorf("status: %+v %v", st, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := Wait(wctx, ep, "0123456789ab", nil); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "carries on") {
		t.Errorf("a cancelled wait: %v", err)
	}
}
