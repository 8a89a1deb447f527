package labtool

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testServer is a real server on 127.0.0.1, in a process group of its own
// so that a freeze or a kill reaches every process it has (postgres forks
// a backend per connection), stopped when the test ends, even failed.
type testServer struct {
	t    *testing.T
	addr string
	// command builds the server's command line, to start it again.
	command func() *exec.Cmd
	// ready says the server answers (by default: it accepts TCP).
	ready func() error
	cmd   *exec.Cmd
}

// need finds a server's binary or skips the test, saying why.
func need(t *testing.T, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s is missing (apt-get install %s): this test needs a real server", path, pkg)
	}
	return path
}

func freePort(t *testing.T) string {
	return strings.TrimPrefix(freeAddrs(t, 1)[0], "127.0.0.1:")
}

func (s *testServer) start() {
	s.t.Helper()
	s.cmd = s.command()
	s.cmd.SysProcAttr = withPgid(s.cmd.SysProcAttr)
	log := &syncBuffer{}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	cmd := s.cmd
	s.t.Cleanup(func() {
		stopGroup(cmd)
		if s.t.Failed() {
			s.t.Logf("%s said:\n%s", cmd.Path, lastLines(log.String(), 20))
		}
	})
	ready := s.ready
	if ready == nil {
		ready = func() error {
			c, err := net.DialTimeout("tcp", s.addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s did not get ready at %s: %v", s.cmd.Path, s.addr, err)
		}
	}
}

func withPgid(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Setpgid = true
	return a
}

// processes are pid and its descendants, parents first: postgres puts
// each backend in a session of its own, out of reach of its group.
func processes(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ")".
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		var state string
		var child, ppid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &child); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(rest, " %s %d", &state, &ppid); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// signalAll sends sig to pid's group and to each of its processes.
func signalAll(pid int, sig syscall.Signal) []int {
	procs := processes(pid)
	_ = syscall.Kill(-pid, sig)
	for _, p := range procs {
		_ = syscall.Kill(p, sig)
	}
	return procs
}

// stopGroup kills cmd's processes (thawed first, so that they die) and
// reaps cmd; a second call does nothing.
func stopGroup(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	signalAll(cmd.Process.Pid, syscall.SIGCONT)
	signalAll(cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}

// kill stops the server at once, as a crash would.
func (s *testServer) kill() { stopGroup(s.cmd) }

// freeze stops every process of the server for d, as a migration's
// freeze does, then lets them go on.
func (s *testServer) freeze(d time.Duration) {
	procs := signalAll(s.cmd.Process.Pid, syscall.SIGSTOP)
	time.Sleep(d)
	for _, p := range procs {
		if err := syscall.Kill(p, syscall.SIGCONT); err != nil {
			s.t.Error(err)
		}
	}
}

// startRedis starts redis-server without snapshots; extra adds options
// (an append-only file, for one that must survive a crash).
func startRedis(t *testing.T, extra ...string) *testServer {
	bin := need(t, "/usr/bin/redis-server", "redis-server")
	port, dir := freePort(t), t.TempDir()
	s := &testServer{t: t, addr: "127.0.0.1:" + port}
	s.command = func() *exec.Cmd {
		args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir}, extra...)
		return exec.Command(bin, args...)
	}
	// Ready once redis itself answers: a dial to a port nothing listens on
	// yet can connect to itself (TCP's simultaneous open, when the kernel
	// picks that very port as the dial's own).
	s.ready = func() error {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "+PONG") {
			return fmt.Errorf("not redis yet: %q %v", line, err)
		}
		return nil
	}
	s.start()
	return s
}

func startMemcached(t *testing.T) *testServer {
	bin := need(t, "/usr/bin/memcached", "memcached")
	port := freePort(t)
	s := &testServer{t: t, addr: "127.0.0.1:" + port}
	s.command = func() *exec.Cmd {
		return exec.Command(bin, "-p", port, "-l", "127.0.0.1", "-U", "0", "-m", "256", "-u", "root")
	}
	s.start()
	return s
}

func startMosquitto(t *testing.T) *testServer {
	bin := need(t, "/usr/sbin/mosquitto", "mosquitto")
	port, dir := freePort(t), t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, []byte("listener "+port+" 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &testServer{t: t, addr: "127.0.0.1:" + port}
	s.command = func() *exec.Cmd { return exec.Command(bin, "-c", conf) }
	s.start()
	return s
}

// startPostgres initializes a cluster in a temporary directory and runs
// it as the postgres user (it refuses root), trusting local connections;
// addr is a URL for user and database postgres.
func startPostgres(t *testing.T) *testServer {
	pgbin := "/usr/lib/postgresql/15/bin"
	need(t, filepath.Join(pgbin, "postgres"), "postgresql-15")
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skip("no postgres user to run postgres as (it refuses root)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	asPostgres := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	dir := t.TempDir()
	// The test's directories are root's, 0700: let postgres through.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(pgbin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = asPostgres
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := freePort(t)
	s := &testServer{t: t, addr: fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", port)}
	s.command = func() *exec.Cmd {
		cmd := exec.Command(filepath.Join(pgbin, "postgres"), "-D", data, "-k", dir, "-h", "127.0.0.1", "-p", port,
			"-c", "fsync=off", "-c", "synchronous_commit=off",
			// Its dynamic shared memory in the data directory, not the
			// host's /dev/shm, where a killed server leaves it.
			"-c", "dynamic_shared_memory_type=mmap")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asPostgres.Credential}
		return cmd
	}
	s.ready = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, s.addr)
		if err == nil {
			c.Close(ctx)
		}
		return err
	}
	s.start()
	return s
}

// runLoad runs Load against o until during returns, then closes its
// stdin and returns its result.
func runLoad(t *testing.T, o LoadOptions, during func()) LoadResult {
	t.Helper()
	pr, pw := io.Pipe()
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- Load(context.Background(), o, pr, &out) }()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "connected"); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("load ended before it connected: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("load did not connect: %q", out.String())
		}
	}
	during()
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r LoadResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	t.Logf("%s: sent %d, ops %d, errors %d, reconnects %d, longest stall %.1f ms, %d buckets; state ok %v: %s",
		r.Service, r.Sent, r.Ops, r.Errors, r.Reconnects, r.LongestStallMs, len(r.Timeline), r.StateOK, r.State)
	if r.Tool != "" {
		t.Logf("tool: %s", r.Tool)
	}
	return r
}
