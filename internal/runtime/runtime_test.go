package runtime

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/procs/procstest"
)

// listed is a runtime that knows some containers by name; Find's logic only.
type listed struct {
	kind  string
	names map[string]bool
	err   error
	Runtime
}

func (l listed) Kind() string { return l.kind }
func (l listed) Inspect(_ context.Context, name string) (*Container, error) {
	if l.err != nil {
		return nil, l.err
	}
	if !l.names[name] {
		return nil, ErrNotFound
	}
	return &Container{Runtime: l.kind, Name: name}, nil
}

func TestSetFind(t *testing.T) {
	s := Set{
		"runc":   listed{kind: "runc", names: map[string]bool{"web": true, "both": true}},
		"podman": listed{kind: "podman", names: map[string]bool{"db": true, "both": true}},
		"lxc":    listed{kind: "lxc", names: map[string]bool{}},
	}
	ctx := context.Background()
	for name, kind := range map[string]string{"web": "runc", "db": "podman"} {
		rt, c, err := s.Find(ctx, name)
		if err != nil || rt.Kind() != kind || c.Name != name {
			t.Errorf("Find(%s): %v %v %v", name, rt, c, err)
		}
	}
	if _, _, err := s.Find(ctx, "nobody"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "lxc, podman, runc") {
		t.Errorf("missing: %v", err)
	}
	if _, _, err := s.Find(ctx, "both"); err == nil || !strings.Contains(err.Error(), "several runtimes (podman, runc)") {
		t.Errorf("ambiguous: %v", err)
	}
	s["lxc"] = listed{kind: "lxc", err: errors.New("lxc-info: permission denied")}
	if _, _, err := s.Find(ctx, "web"); err == nil || !strings.Contains(err.Error(), "--runtime") {
		t.Errorf("a broken runtime must be named, with the way around it: %v", err)
	}
	if _, err := s.Get("rkt"); err == nil || !strings.Contains(err.Error(), `"rkt" is not available`) {
		t.Errorf("Get: %v", err)
	}
	if _, err := (Set{}).Get("runc"); err == nil || !strings.Contains(err.Error(), "present: none") {
		t.Errorf("empty set: %v", err)
	}
}

func TestCheckpointOptionsRefuse(t *testing.T) {
	for _, c := range []struct {
		o    CheckpointOptions
		caps Caps
		want string // "" for none
	}{
		{CheckpointOptions{}, Caps{}, ""},
		{CheckpointOptions{Lazy: true}, Caps{}, "x: lazy dumps are not available on this host (see ferry check)"},
		{CheckpointOptions{Lazy: true}, Caps{LazyDump: true}, ""},
		{CheckpointOptions{PreDump: true}, Caps{LazyDump: true}, "x: CRIU pre-dumps are not supported"},
		{CheckpointOptions{ParentDir: "../0"}, Caps{}, "x: CRIU pre-dumps are not supported"},
		{CheckpointOptions{PreDump: true, ParentDir: "../0"}, Caps{PreDump: true}, ""},
	} {
		err := c.o.Refuse("x", c.caps)
		if (err == nil) != (c.want == "") || (err != nil && err.Error() != c.want) {
			t.Errorf("%+v with %+v: %v, want %q", c.o, c.caps, err, c.want)
		}
	}
}

type fakeConn struct{ closed *int }

func (f fakeConn) Close() error { *f.closed++; return nil }

// A Client dials once, keeps the connection, dials again after Close, and
// keeps no failed dial.
func TestClientDialsOnce(t *testing.T) {
	var l Client[fakeConn]
	dials, closed := 0, 0
	fail := true
	dial := func() (fakeConn, error) {
		dials++
		if fail {
			return fakeConn{}, errors.New("no daemon")
		}
		return fakeConn{&closed}, nil
	}
	if _, err := l.Get(dial); err == nil {
		t.Fatal("a failed dial gave a connection")
	}
	fail = false
	for i := 0; i < 3; i++ {
		if _, err := l.Get(dial); err != nil {
			t.Fatal(err)
		}
	}
	if dials != 2 {
		t.Errorf("%d dials, want 2 (the failed one, then one kept)", dials)
	}
	if err := l.Close(); err != nil || closed != 1 {
		t.Fatalf("Close: %v, closed %d", err, closed)
	}
	if err := l.Close(); err != nil || closed != 1 {
		t.Fatalf("Close again: %v, closed %d", err, closed)
	}
	if _, err := l.Get(dial); err != nil || dials != 3 {
		t.Fatalf("after Close: %v, %d dials", err, dials)
	}
}

// inspected is a runtime that reports one container as it is told.
type inspected struct {
	c Container
	Runtime
}

func (r inspected) Inspect(context.Context, string) (*Container, error) {
	c := r.c
	return &c, nil
}

// State believes the runtime, except about a running container whose
// init is dying: that one is stopped.
func TestState(t *testing.T) {
	for _, c := range []struct {
		name string
		c    Container
		want string
	}{
		{"running", Container{Status: "running", PID: os.Getpid()}, "running"},
		{"running, no PID known", Container{Status: "running"}, "running"},
		{"paused", Container{Status: "paused", PID: os.Getpid()}, "paused"},
		{"stopped", Container{Status: "stopped"}, "stopped"},
		{"running, its init a zombie", Container{Status: "running", PID: procstest.Zombie(t)}, "stopped"},
	} {
		if st, err := State(context.Background(), inspected{c: c.c}, "x"); err != nil || st != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, st, err, c.want)
		}
	}
}

// A help text names kinds as a sentence does.
func TestJoinKinds(t *testing.T) {
	for _, c := range []struct {
		kinds []string
		want  string
	}{
		{nil, ""},
		{[]string{"runc"}, "runc"},
		{[]string{"runc", "lxc"}, "runc or lxc"},
		{[]string{"runc", "podman", "lxc"}, "runc, podman or lxc"},
	} {
		if got := JoinKinds(c.kinds, "or"); got != c.want {
			t.Errorf("JoinKinds(%q) = %q, want %q", c.kinds, got, c.want)
		}
	}
}
