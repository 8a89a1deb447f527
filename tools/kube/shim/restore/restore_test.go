//go:build linux

package restore

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ferry-migrate/ferry/api/restoreshim"
)

// fakeTask stands for the runc shim's task service. Its embedded
// interface is nil: a call no test expects panics.
type fakeTask struct {
	taskAPI.TTRPCTaskService

	mu       sync.Mutex
	created  []*taskAPI.CreateTaskRequest
	bundle   string
	started  int
	startAnn map[string]string // config.json's annotations when Start ran
	killed   int
	deleted  int
}

func (f *fakeTask) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, r)
	f.bundle = r.Bundle
	return &taskAPI.CreateTaskResponse{Pid: 100}, nil
}

func (f *fakeTask) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started++
	if f.bundle != "" {
		f.startAnn = readAnnotations(f.bundle)
	}
	return &taskAPI.StartResponse{Pid: 4242}, nil
}

func (f *fakeTask) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed++
	return &emptypb.Empty{}, nil
}

func (f *fakeTask) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted++
	return &taskAPI.DeleteResponse{}, nil
}

func (f *fakeTask) counts() (created, started, killed, deleted int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.created), f.started, f.killed, f.deleted
}

func readAnnotations(bundle string) map[string]string {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	_ = json.Unmarshal(data, &spec)
	return spec.Annotations
}

// setup returns a service over a fake, the rendezvous directory, and a
// context in containerd's CRI namespace.
func setup(t *testing.T) (*Service, *fakeTask, string, context.Context) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "r")
	t.Setenv(restoreshim.DirEnv, root)
	t.Setenv(restoreshim.WaitEnv, "10s")
	fake := &fakeTask{}
	s, ok := New(fake).(*Service)
	if !ok {
		t.Fatalf("New(fake) is %T, want *Service", New(fake))
	}
	return s, fake, root, namespaces.WithNamespace(context.Background(), "k8s.io")
}

// bundle writes a bundle whose spec has these annotations.
func bundle(t *testing.T, annotations map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	spec := map[string]any{
		"ociVersion":  "1.2.0",
		"process":     map[string]any{"args": []string{"/app", "--serve"}, "cwd": "/"},
		"annotations": annotations,
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// created creates container id in a bundle annotated with key.
func created(t *testing.T, ctx context.Context, s *Service, id, key string) string {
	t.Helper()
	b := bundle(t, map[string]string{restoreshim.Annotation: key, "io.kubernetes.cri.container-type": "container"})
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: id, Bundle: b}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return b
}

type started struct {
	resp *taskAPI.StartResponse
	err  error
}

// start runs Start in the background; its result comes on the channel.
func start(ctx context.Context, s *Service, id string) <-chan started {
	ch := make(chan started, 1)
	go func() {
		resp, err := s.Start(ctx, &taskAPI.StartRequest{ID: id})
		ch <- started{resp, err}
	}()
	return ch
}

func result(t *testing.T, ch <-chan started) started {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return")
		return started{}
	}
}

// waiting waits until Start took container id.
func waiting(t *testing.T, s *Service, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s.mu.Lock()
		c := s.containers[id]
		ok := c != nil && c.started
		s.mu.Unlock()
		if ok {
			return
		}
	}
	t.Fatal("Start did not begin waiting")
}

func ask(t *testing.T, sock string, req restoreshim.Request) restoreshim.Reply {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	defer conn.Close()
	rep, err := restoreshim.Ask(conn, req, 5*time.Second)
	if err != nil {
		t.Fatalf("Ask: %v", err)
	}
	return rep
}

func TestCreatePassesThrough(t *testing.T) {
	s, fake, root, ctx := setup(t)
	for _, ann := range []map[string]string{
		{"other": "x"},
		// The pod's sandbox gets the pod's annotations too.
		{restoreshim.Annotation: "abc", "io.kubernetes.cri.container-type": "sandbox"},
	} {
		if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c", Bundle: bundle(t, ann)}); err != nil {
			t.Fatalf("Create(%v): %v", ann, err)
		}
	}
	for _, r := range fake.created {
		if r.Checkpoint != "" || r.Options != nil {
			t.Errorf("pass-through Create was changed: checkpoint %q, options %v", r.Checkpoint, r.Options)
		}
	}
	if len(fake.created) != 2 {
		t.Errorf("inner Create called %d times, want 2", len(fake.created))
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rendezvous directory made for no restore: %v", err)
	}
	if len(s.containers) != 0 {
		t.Errorf("containers recorded: %v", s.containers)
	}
}

func TestCreateRejectsBadKey(t *testing.T) {
	s, fake, _, ctx := setup(t)
	b := bundle(t, map[string]string{restoreshim.Annotation: "../../etc"})
	_, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c", Bundle: b})
	if err == nil || !strings.Contains(err.Error(), restoreshim.Annotation) || !strings.Contains(err.Error(), `"../../etc"`) {
		t.Fatalf("Create error %v, want one naming the annotation and the key", err)
	}
	if n, _, _, _ := fake.counts(); n != 0 {
		t.Errorf("inner Create called for a bad key")
	}
}

func TestCreateRejectsBadWait(t *testing.T) {
	s, fake, _, ctx := setup(t)
	t.Setenv(restoreshim.WaitEnv, "soon")
	b := bundle(t, map[string]string{restoreshim.Annotation: "k"})
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c", Bundle: b}); err == nil || !strings.Contains(err.Error(), restoreshim.WaitEnv) {
		t.Fatalf("Create error %v, want one naming %s", err, restoreshim.WaitEnv)
	}
	if n, _, _, _ := fake.counts(); n != 0 {
		t.Errorf("inner Create called")
	}
}

func TestCreatePreparesRestore(t *testing.T) {
	s, fake, root, ctx := setup(t)
	opts, err := typeurl.MarshalAnyToProto(&options.Options{BinaryName: "/opt/runc", SystemdCgroup: true})
	if err != nil {
		t.Fatal(err)
	}
	b := bundle(t, map[string]string{restoreshim.Annotation: "src-1"})
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "new", Bundle: b, Options: opts}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	// No options at all: the shim's defaults, plus the work path.
	b2 := bundle(t, map[string]string{restoreshim.Annotation: "src-2"})
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "new2", Bundle: b2}); err != nil {
		t.Fatalf("Create without options: %v", err)
	}

	for i, want := range []*options.Options{
		{BinaryName: "/opt/runc", SystemdCgroup: true, CriuWorkPath: filepath.Join(root, "src-1", "work")},
		{CriuWorkPath: filepath.Join(root, "src-2", "work")},
	} {
		r := fake.created[i]
		key := []string{"src-1", "src-2"}[i]
		if want := filepath.Join(root, key, "images"); r.Checkpoint != want {
			t.Errorf("checkpoint %q, want %q", r.Checkpoint, want)
		}
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			t.Fatalf("options: %v", err)
		}
		got, ok := v.(*options.Options)
		if !ok || got.BinaryName != want.BinaryName || got.SystemdCgroup != want.SystemdCgroup || got.CriuWorkPath != want.CriuWorkPath {
			t.Errorf("options %+v, want %+v", v, want)
		}
	}

	var c restoreshim.Created
	data, err := os.ReadFile(filepath.Join(root, "src-1", restoreshim.CreatedFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if want := (restoreshim.Created{ID: "new", Namespace: "k8s.io", Bundle: b, ShimPID: os.Getpid()}); c != want {
		t.Errorf("container.json %+v, want %+v", c, want)
	}
	if fi, err := os.Stat(filepath.Join(root, "src-1", restoreshim.SocketFile)); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("no socket listening: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(root, "src-1")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("key directory: %v, mode %v", err, fi.Mode())
	}
}

func TestCreateRefusesTakenKey(t *testing.T) {
	s, fake, _, ctx := setup(t)
	created(t, ctx, s, "a", "k")
	b := bundle(t, map[string]string{restoreshim.Annotation: "k"})
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "b", Bundle: b}); err == nil || !strings.Contains(err.Error(), "already taken by container a") {
		t.Fatalf("second Create on a waiting key: %v", err)
	}
	if n, _, _, _ := fake.counts(); n != 1 {
		t.Errorf("inner Create called %d times, want 1", n)
	}
}

func TestStartRestores(t *testing.T) {
	s, fake, root, ctx := setup(t)
	b := created(t, ctx, s, "new", "src")
	ch := start(ctx, s, "new")

	rep := ask(t, filepath.Join(root, "src", restoreshim.SocketFile), restoreshim.Request{CRIUConfig: "/run/ferry/m1/criu.conf"})
	if rep != (restoreshim.Reply{PID: 4242}) {
		t.Errorf("reply %+v, want pid 4242", rep)
	}
	r := result(t, ch)
	if r.err != nil || r.resp.GetPid() != 4242 {
		t.Fatalf("Start: %v, %v", r.resp, r.err)
	}
	if got := fake.startAnn["org.criu.config"]; got != "/run/ferry/m1/criu.conf" {
		t.Errorf("inner Start saw org.criu.config %q", got)
	}
	if fake.startAnn[restoreshim.Annotation] != "src" {
		t.Errorf("other annotations lost: %v", fake.startAnn)
	}
	var spec map[string]any
	data, _ := os.ReadFile(filepath.Join(b, "config.json"))
	if err := json.Unmarshal(data, &spec); err != nil || spec["ociVersion"] != "1.2.0" || spec["process"] == nil {
		t.Errorf("rest of config.json lost: %s (%v)", data, err)
	}
	if _, err := os.Stat(filepath.Join(root, "src", restoreshim.SocketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Start: %v", err)
	}

	// One Start waits: another passes through.
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "new"}); err != nil {
		t.Fatal(err)
	}
	if _, n, _, _ := fake.counts(); n != 2 {
		t.Errorf("inner Start called %d times, want 2", n)
	}
}

func TestStartWithoutConfigKeepsSpec(t *testing.T) {
	s, fake, root, ctx := setup(t)
	b := created(t, ctx, s, "new", "src")
	before, _ := os.ReadFile(filepath.Join(b, "config.json"))
	ch := start(ctx, s, "new")
	if rep := ask(t, filepath.Join(root, "src", restoreshim.SocketFile), restoreshim.Request{}); rep.PID != 4242 {
		t.Errorf("reply %+v", rep)
	}
	if r := result(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
	after, _ := os.ReadFile(filepath.Join(b, "config.json"))
	if string(before) != string(after) {
		t.Errorf("config.json rewritten without a CRIU config")
	}
	if _, n, _, _ := fake.counts(); n != 1 {
		t.Errorf("inner Start called %d times", n)
	}
}

func TestStartAbort(t *testing.T) {
	s, fake, root, ctx := setup(t)
	b := created(t, ctx, s, "new", "src")
	ch := start(ctx, s, "new")
	rep := ask(t, filepath.Join(root, "src", restoreshim.SocketFile), restoreshim.Request{Abort: "source vanished", CRIUConfig: "/x"})
	if rep.Error != "aborted: source vanished" || rep.PID != 0 {
		t.Errorf("reply %+v", rep)
	}
	if r := result(t, ch); r.err == nil || !strings.Contains(r.err.Error(), "source vanished") {
		t.Errorf("Start error %v", r.err)
	}
	if _, n, _, _ := fake.counts(); n != 0 {
		t.Errorf("inner Start called on abort")
	}
	if _, ok := readAnnotations(b)["org.criu.config"]; ok {
		t.Errorf("config.json rewritten on abort")
	}
}

func TestKillWhileWaiting(t *testing.T) {
	s, fake, root, ctx := setup(t)
	created(t, ctx, s, "new", "src")
	// The agent's links: Delete must remove them, not their targets.
	target := t.TempDir()
	if err := os.WriteFile(filepath.Join(target, "pages-1.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{restoreshim.ImagesLink, restoreshim.WorkLink} {
		if err := os.Symlink(target, filepath.Join(root, "src", l)); err != nil {
			t.Fatal(err)
		}
	}

	ch := start(ctx, s, "new")
	waiting(t, s, "new")
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "new", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	r := result(t, ch)
	if r.err == nil || r.err.Error() != errStopped.Error() {
		t.Errorf("Start error %v, want %v", r.err, errStopped)
	}
	if _, n, k, _ := fake.counts(); n != 0 || k != 1 {
		t.Errorf("inner Start %d, Kill %d; want 0, 1", n, k)
	}

	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "new"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "src")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("key directory left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "pages-1.img")); err != nil {
		t.Errorf("the images link's target was removed: %v", err)
	}
	if _, _, _, d := fake.counts(); d != 1 {
		t.Errorf("inner Delete called %d times", d)
	}
}

func TestDeleteWhileAgentConnected(t *testing.T) {
	s, fake, root, ctx := setup(t)
	created(t, ctx, s, "new", "src")
	ch := start(ctx, s, "new")
	// The agent connects but has not asked yet.
	conn, err := net.Dial("unix", filepath.Join(root, "src", restoreshim.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waiting(t, s, "new")
	time.Sleep(50 * time.Millisecond) // let Start take the connection
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "new"}); err != nil {
		t.Fatal(err)
	}
	if r := result(t, ch); r.err == nil || r.err.Error() != errStopped.Error() {
		t.Errorf("Start error %v, want %v", r.err, errStopped)
	}
	if _, n, _, d := fake.counts(); n != 0 || d != 1 {
		t.Errorf("inner Start %d, Delete %d; want 0, 1", n, d)
	}
}

func TestKillBeforeStart(t *testing.T) {
	s, fake, _, ctx := setup(t)
	created(t, ctx, s, "new", "src")
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "new", Signal: 15}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "new"}); err == nil || err.Error() != errStopped.Error() {
		t.Errorf("Start error %v, want %v", err, errStopped)
	}
	if _, n, _, _ := fake.counts(); n != 0 {
		t.Errorf("inner Start called")
	}
}

func TestStartTimeout(t *testing.T) {
	s, fake, root, ctx := setup(t)
	t.Setenv(restoreshim.WaitEnv, "150ms")
	created(t, ctx, s, "new", "src")
	begin := time.Now()
	_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "new"})
	if err == nil || !strings.Contains(err.Error(), "no ferry agent asked for the restore") || !strings.Contains(err.Error(), "150ms") {
		t.Fatalf("Start error %v", err)
	}
	if d := time.Since(begin); d < 150*time.Millisecond || d > 3*time.Second {
		t.Errorf("Start gave up after %s", d)
	}
	if _, n, _, _ := fake.counts(); n != 0 {
		t.Errorf("inner Start called")
	}
	if _, err := os.Stat(filepath.Join(root, "src", restoreshim.SocketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after the timeout: %v", err)
	}
	// The key is free again for a new container (the kubelet's retry).
	created(t, ctx, s, "retry", "src")
}

func TestUnknownStartPassesThrough(t *testing.T) {
	s, fake, _, ctx := setup(t)
	resp, err := s.Start(ctx, &taskAPI.StartRequest{ID: "other"})
	if err != nil || resp.GetPid() != 4242 {
		t.Fatalf("Start: %v, %v", resp, err)
	}
	if _, n, _, _ := fake.counts(); n != 1 {
		t.Errorf("inner Start called %d times", n)
	}
}

type interceptingTask struct{ fakeTask }

func (*interceptingTask) UnaryServerInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, u ttrpc.Unmarshaler, i *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
		return m(ctx, u)
	}
}

func TestNewForwardsInterceptor(t *testing.T) {
	if _, ok := New(&fakeTask{}).(shim.TTRPCServerUnaryOptioner); ok {
		t.Error("wrapper has an interceptor the inner service lacks")
	}
	w := New(&interceptingTask{})
	if _, ok := w.(shim.TTRPCServerUnaryOptioner); !ok {
		t.Errorf("%T lost the inner service's interceptor", w)
	}
	if _, ok := w.(taskAPI.TTRPCTaskService); !ok {
		t.Errorf("%T is no task service", w)
	}
}

// The shim serves what RegisterTTRPC registers: the wrapper, reached over
// TTRPC with the namespace in the request's metadata, as containerd
// sends it.
func TestServedOverTTRPC(t *testing.T) {
	s, fake, root, ctx := setup(t)
	server, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterTTRPC(server); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(context.Background(), ln)
	defer server.Close()
	conn, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	task := taskAPI.NewTTRPCTaskClient(client)

	b := bundle(t, map[string]string{restoreshim.Annotation: "src"})
	if _, err := task.Create(ctx, &taskAPI.CreateTaskRequest{ID: "new", Bundle: b}); err != nil {
		t.Fatal(err)
	}
	if got := fake.created[0].Checkpoint; got != filepath.Join(root, "src", "images") {
		t.Errorf("inner Create got checkpoint %q: the wrapper was not served", got)
	}
	data, err := os.ReadFile(filepath.Join(root, "src", restoreshim.CreatedFile))
	if err != nil {
		t.Fatal(err)
	}
	var c restoreshim.Created
	if err := json.Unmarshal(data, &c); err != nil || c.Namespace != "k8s.io" {
		t.Errorf("container.json %s: namespace %q, want k8s.io (%v)", data, c.Namespace, err)
	}
}
