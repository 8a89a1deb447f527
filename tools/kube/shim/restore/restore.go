//go:build linux

// Package restore wraps the runc shim's task service so that a container
// whose spec carries restoreshim.Annotation is restored from a ferry
// migration's checkpoint instead of started afresh. api/restoreshim tells
// the protocol with the ferry agent.
package restore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ferry-migrate/ferry/api/restoreshim"
)

const (
	// criuConfigAnnotation names the CRIU configuration file runc hands
	// to CRIU (after its RPC options) for a checkpoint or a restore.
	criuConfigAnnotation = "org.criu.config"
	// containerd's CRI marks each spec with its kind; the pod's sandbox
	// (pause) gets the pod's pass-through annotations too, and is never
	// the container to restore.
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
	containerTypeSandbox    = "sandbox"
	// maxSocketPath is what a unix socket address holds (sun_path).
	maxSocketPath = 107
)

var errStopped = errors.New("the replacement container was stopped before ferry restored it")

// Service is the shim's task service: the runc shim's, with Create,
// Start, Kill and Delete watching for the containers to restore.
type Service struct {
	taskAPI.TTRPCTaskService

	mu         sync.Mutex
	containers map[string]*container // to restore, by ID, from Create to Delete
}

// container is one created to be restored. Its fields after the first
// line are guarded by Service.mu.
type container struct {
	id, key, dir, bundle string
	wait                 time.Duration
	stop                 chan struct{} // closed by a Kill or Delete
	stopOnce             sync.Once

	ln       *net.UnixListener // the rendezvous, until Start is done with it
	started  bool              // Start took it (one Start waits, once)
	finished bool              // that Start returned
}

// New wraps inner, the runc shim's task service. The shim asks each
// plugin instance for an UnaryServerInterceptor as well (inner has one
// in shim_tracing builds), so what New returns has inner's when it has
// one.
func New(inner taskAPI.TTRPCTaskService) shim.TTRPCService {
	s := &Service{TTRPCTaskService: inner, containers: map[string]*container{}}
	if o, ok := inner.(shim.TTRPCServerUnaryOptioner); ok {
		return struct {
			*Service
			shim.TTRPCServerUnaryOptioner
		}{s, o}
	}
	return s
}

// RegisterTTRPC serves s as the task API: the shim registers each TTRPC
// plugin's instance through it, so s's methods are the ones called.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

// Create turns a container whose spec carries restoreshim.Annotation into
// one that runc restores, on Start, from the key's images directory; the
// others pass through untouched.
func (s *Service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	key, err := restoreKey(r.Bundle)
	if err != nil {
		return nil, err
	}
	if key == "" {
		return s.TTRPCTaskService.Create(ctx, r)
	}
	c, err := s.claim(r, key)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.closeSocket(c)
			s.mu.Lock()
			delete(s.containers, c.id)
			s.mu.Unlock()
		}
	}()
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("ferry restore: %w", err)
	}
	if r.Options, err = withCriuWorkPath(r.Options, filepath.Join(c.dir, restoreshim.WorkLink)); err != nil {
		return nil, err
	}
	r.Checkpoint = filepath.Join(c.dir, restoreshim.ImagesLink)

	resp, err := s.TTRPCTaskService.Create(ctx, r)
	if err != nil {
		return nil, err
	}
	// The socket listens before container.json tells the agent it may
	// connect.
	ns, _ := namespaces.Namespace(ctx)
	err = s.listen(c)
	if err == nil {
		err = writeJSON(filepath.Join(c.dir, restoreshim.CreatedFile), restoreshim.Created{
			ID: r.ID, Namespace: ns, Bundle: r.Bundle, ShimPID: os.Getpid(),
		}, 0o600)
	}
	if err != nil {
		// containerd takes a failed Create for no container: undo it.
		if _, derr := s.TTRPCTaskService.Delete(ctx, &taskAPI.DeleteRequest{ID: r.ID}); derr != nil {
			log.G(ctx).WithError(derr).WithField("id", r.ID).Warn("ferry restore: deleting the container after a failed create")
		}
		return nil, fmt.Errorf("ferry restore: %w", err)
	}
	log.G(ctx).WithFields(log.Fields{"id": r.ID, "key": key}).
		Infof("ferry restore: created from %s; Start waits at %s", r.Checkpoint, c.socket())
	return resp, nil
}

// restoreKey reads the bundle's spec: the key to restore from, or "".
func restoreKey(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("spec of bundle %s: %w", bundle, err)
	}
	key, ok := spec.Annotations[restoreshim.Annotation]
	if !ok || spec.Annotations[containerTypeAnnotation] == containerTypeSandbox {
		return "", nil
	}
	if err := restoreshim.CheckKey(key); err != nil {
		return "", fmt.Errorf("ferry restore: annotation %s: %w", restoreshim.Annotation, err)
	}
	return key, nil
}

// claim records r's container as one to restore from key. A key serves
// one waiting container at a time (its socket is the key's); a later
// container may take it over once the earlier one's Start returned (the
// kubelet restarting the container).
func (s *Service) claim(r *taskAPI.CreateTaskRequest, key string) (*container, error) {
	dir := os.Getenv(restoreshim.DirEnv)
	if dir == "" {
		dir = restoreshim.DefaultDir
	}
	wait := restoreshim.DefaultWait
	if v := os.Getenv(restoreshim.WaitEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("ferry restore: %s=%q: want a positive Go duration", restoreshim.WaitEnv, v)
		}
		wait = d
	}
	c := &container{
		id: r.ID, key: key, dir: restoreshim.KeyDir(dir, key), bundle: r.Bundle,
		wait: wait, stop: make(chan struct{}),
	}
	if len(c.socket()) > maxSocketPath {
		return nil, fmt.Errorf("ferry restore: socket path %s is longer than a unix socket address holds (%d)", c.socket(), maxSocketPath)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.containers {
		if o.key == key && !o.finished {
			return nil, fmt.Errorf("ferry restore: key %q is already taken by container %s, not restored yet", key, o.id)
		}
	}
	s.containers[c.id] = c
	return c, nil
}

func (c *container) socket() string { return filepath.Join(c.dir, restoreshim.SocketFile) }

// listen opens c's rendezvous socket, replacing one an earlier shim left.
func (s *Service) listen(c *container) error {
	if err := os.Remove(c.socket()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.socket(), Net: "unix"})
	if err != nil {
		return err
	}
	s.mu.Lock()
	c.ln = ln
	s.mu.Unlock()
	return nil
}

// closeSocket closes c's rendezvous and removes its socket, once.
func (s *Service) closeSocket(c *container) {
	s.mu.Lock()
	ln := c.ln
	c.ln = nil
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
		_ = os.Remove(c.socket())
	}
}

// withCriuWorkPath sets CRIU's work directory in the runc options the
// shim reads from Create's Options (none: runc's defaults).
func withCriuWorkPath(a *anypb.Any, work string) (*anypb.Any, error) {
	opts := &options.Options{}
	if a.GetValue() != nil {
		v, err := typeurl.UnmarshalAny(a)
		if err != nil {
			return nil, fmt.Errorf("ferry restore: runtime options: %w", err)
		}
		o, ok := v.(*options.Options)
		if !ok {
			return nil, fmt.Errorf("ferry restore: runtime options are %T, not runc's", v)
		}
		opts = o
	}
	opts.CriuWorkPath = work
	return typeurl.MarshalAnyToProto(opts)
}

// Start, for a container to restore, waits for the ferry agent's request
// on the key's socket, then has runc restore it (the inner Start) and
// answers with the outcome.
func (s *Service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, ln := s.take(r)
	if c == nil {
		return s.TTRPCTaskService.Start(ctx, r)
	}
	defer func() {
		s.closeSocket(c)
		s.mu.Lock()
		c.finished = true
		s.mu.Unlock()
	}()
	logger := log.G(ctx).WithFields(log.Fields{"id": r.ID, "key": c.key})
	if ln == nil { // Delete came first
		return nil, errStopped
	}
	logger.Infof("ferry restore: waiting up to %s for the ferry agent", c.wait)
	deadline := time.Now().Add(c.wait)
	conn, err := c.accept(ctx, ln, deadline)
	if err != nil {
		logger.WithError(err).Warn("ferry restore: not restored")
		return nil, err
	}
	defer conn.Close()

	// A Kill or Delete (or containerd giving up) while the agent is
	// connected but has not asked yet ends the wait too.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-c.stop:
		case <-ctx.Done():
		case <-done:
			return
		}
		_ = conn.SetReadDeadline(time.Now())
	}()

	var (
		resp             *taskAPI.StartResponse
		errInner, errNot error
		asked            bool
	)
	err = restoreshim.Answer(conn, time.Until(deadline), func(req restoreshim.Request) restoreshim.Reply {
		asked = true
		switch {
		case req.Abort != "":
			errNot = fmt.Errorf("ferry aborted the restore: %s", req.Abort)
			return restoreshim.Reply{Error: "aborted: " + req.Abort}
		case c.stopped():
			errNot = errStopped
			return restoreshim.Reply{Error: errStopped.Error()}
		}
		if req.CRIUConfig != "" {
			if errNot = setAnnotation(filepath.Join(c.bundle, "config.json"), criuConfigAnnotation, req.CRIUConfig); errNot != nil {
				errNot = fmt.Errorf("ferry restore: %w", errNot)
				return restoreshim.Reply{Error: errNot.Error()}
			}
		}
		logger.Infof("ferry restore: restoring (CRIU configuration %q)", req.CRIUConfig)
		if resp, errInner = s.TTRPCTaskService.Start(ctx, r); errInner != nil {
			return restoreshim.Reply{Error: errInner.Error()}
		}
		return restoreshim.Reply{PID: int(resp.GetPid())}
	})
	switch {
	case !asked:
		errNot = c.whyNot(ctx, err)
	case err != nil:
		logger.WithError(err).Warn("ferry restore: the agent did not get its reply")
	}
	if errNot != nil {
		logger.WithError(errNot).Warn("ferry restore: not restored")
		return nil, errNot
	}
	if errInner != nil {
		logger.WithError(errInner).Warn("ferry restore: restore failed")
	} else {
		logger.Infof("ferry restore: restored, pid %d", resp.GetPid())
	}
	return resp, errInner
}

// take returns the container r starts, when it is one to restore that no
// Start took yet, with its socket's listener.
func (s *Service) take(r *taskAPI.StartRequest) (*container, *net.UnixListener) {
	if r.ExecID != "" {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[r.ID]
	if c == nil || c.started {
		return nil, nil
	}
	c.started = true
	return c, c.ln
}

// accept waits for the agent's connection until deadline, a Kill or
// Delete, or ctx's end.
func (c *container) accept(ctx context.Context, ln *net.UnixListener, deadline time.Time) (net.Conn, error) {
	if c.stopped() {
		return nil, errStopped
	}
	type accepted struct {
		conn net.Conn
		err  error
	}
	ch := make(chan accepted, 1)
	go func() {
		conn, err := ln.Accept()
		ch <- accepted{conn, err}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var why error
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, fmt.Errorf("ferry restore: %s: %w", c.socket(), a.err)
		}
		return a.conn, nil
	case <-c.stop:
		why = errStopped
	case <-timer.C:
		why = c.timeout()
	case <-ctx.Done():
		why = fmt.Errorf("ferry restore: waiting for the ferry agent: %w", ctx.Err())
	}
	// Unblock Accept; a connection that came meanwhile is dropped.
	_ = ln.Close()
	if a := <-ch; a.conn != nil {
		_ = a.conn.Close()
	}
	return nil, why
}

// whyNot tells why no request came on a connection: err is Answer's.
func (c *container) whyNot(ctx context.Context, err error) error {
	switch {
	case c.stopped():
		return errStopped
	case ctx.Err() != nil:
		return fmt.Errorf("ferry restore: waiting for the ferry agent: %w", ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded):
		return c.timeout()
	}
	return fmt.Errorf("ferry restore: %w", err)
}

func (c *container) timeout() error {
	return fmt.Errorf("ferry restore: no ferry agent asked for the restore of container %s (key %s) within %s (%s)",
		c.id, c.key, c.wait, restoreshim.WaitEnv)
}

func (c *container) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// stopWaiting ends a waiting Start of the container id, if one of ours.
func (s *Service) stopWaiting(id string) *container {
	s.mu.Lock()
	c := s.containers[id]
	s.mu.Unlock()
	if c != nil {
		c.stopOnce.Do(func() { close(c.stop) })
	}
	return c
}

// Kill ends a Start still waiting for the agent, then kills as usual.
func (s *Service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	if r.ExecID == "" {
		s.stopWaiting(r.ID)
	}
	return s.TTRPCTaskService.Kill(ctx, r)
}

// Delete ends a Start still waiting for the agent, deletes as usual, then
// removes the key's directory (unless a later container took the key
// over).
func (s *Service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if r.ExecID != "" {
		return s.TTRPCTaskService.Delete(ctx, r)
	}
	c := s.stopWaiting(r.ID)
	resp, err := s.TTRPCTaskService.Delete(ctx, r)
	if err != nil || c == nil {
		return resp, err
	}
	s.closeSocket(c)
	s.mu.Lock()
	delete(s.containers, c.id)
	shared := false
	for _, o := range s.containers {
		shared = shared || o.key == c.key
	}
	s.mu.Unlock()
	if !shared {
		// RemoveAll unlinks the images and work links, never what they
		// point at: those are the agent's migration directories.
		if err := os.RemoveAll(c.dir); err != nil {
			log.G(ctx).WithError(err).WithField("id", r.ID).Warn("ferry restore: removing the key's directory")
		}
	}
	return resp, nil
}

// setAnnotation sets one annotation in the spec at path, keeping the
// rest of it.
func setAnnotation(path, key, value string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var annotations map[string]string
	if raw, ok := spec["annotations"]; ok {
		if err := json.Unmarshal(raw, &annotations); err != nil {
			return fmt.Errorf("%s: annotations: %w", path, err)
		}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[key] = value
	if spec["annotations"], err = json.Marshal(annotations); err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return writeJSON(path, spec, info.Mode().Perm())
}

// writeJSON writes v to path atomically: readers see the old file or the
// whole new one.
func writeJSON(path string, v any, perm fs.FileMode) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, there is none
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
