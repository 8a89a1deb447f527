package kubernetes

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

const (
	kubeletRoot = "/var/lib/kubelet"
	podUID      = "6f1d2c3b-4a59-4e87-9d6c-5b4a39281706"
	otherUID    = "11111111-2222-3333-4444-555555555555"
	sandboxID   = "4e0c5f2d8a7b6c9e1f3a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e"
	ctrID       = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"
	criState    = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/" + sandboxID
	criRoot     = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/" + sandboxID
)

func podDir(uid string) string { return kubeletRoot + "/pods/" + uid }

func volDir(uid, plugin, name string) string {
	return podDir(uid) + "/volumes/kubernetes.io~" + plugin + "/" + name
}

func bind(src, dst string) specs.Mount {
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "rw"}}
}

// ociDefaults are the mounts every container has, none of them binds.
var ociDefaults = []specs.Mount{
	{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
	{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
	{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance"}},
	{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
	{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
}

// criMounts are the binds the kubelet and containerd's CRI give every
// pod container: the pod's own files and the sandbox's.
func criMounts() []specs.Mount {
	return []specs.Mount{
		bind(podDir(podUID)+"/etc-hosts", "/etc/hosts"),
		bind(podDir(podUID)+"/containers/app/"+ctrID[:8], "/dev/termination-log"),
		bind(criRoot+"/hostname", "/etc/hostname"),
		bind(criRoot+"/resolv.conf", "/etc/resolv.conf"),
		bind(criState+"/shm", "/dev/shm"),
	}
}

func spec(extra ...specs.Mount) *specs.Spec {
	ms := append(append(append([]specs.Mount{}, ociDefaults...), criMounts()...), extra...)
	return &specs.Spec{Version: specs.Version, Mounts: ms}
}

func TestClassifyMounts(t *testing.T) {
	tests := []struct {
		name       string
		extra      []specs.Mount
		shared     []string // the controller's word: storage the target shares
		want       []runtime.Volume
		wantShared []shareddir.Dir
		wantErr    []string // substrings; none: accepted
	}{
		{name: "the pod's and the sandbox's own files"},
		{name: "volumes the kubelet makes stay", extra: []specs.Mount{
			bind(volDir(podUID, "configmap", "conf"), "/etc/app"),
			bind(volDir(podUID, "secret", "tls"), "/etc/tls"),
			bind(volDir(podUID, "projected", "kube-api-access-x7k2p"), "/var/run/secrets/kubernetes.io/serviceaccount"),
			bind(volDir(podUID, "downward-api", "info"), "/etc/podinfo"),
		}},
		{name: "an emptyDir moves", extra: []specs.Mount{
			bind(volDir(podUID, "empty-dir", "data"), "/data"),
		}, want: []runtime.Volume{{Name: "data", Path: "/data", Dir: volDir(podUID, "empty-dir", "data")}}},
		{name: "emptyDirs among the rest, in order", extra: []specs.Mount{
			bind(volDir(podUID, "empty-dir", "cache"), "/var/cache/app"),
			bind(volDir(podUID, "configmap", "conf"), "/etc/app"),
			bind(volDir(podUID, "empty-dir", "data"), "/data"),
		}, want: []runtime.Volume{
			{Name: "cache", Path: "/var/cache/app", Dir: volDir(podUID, "empty-dir", "cache")},
			{Name: "data", Path: "/data", Dir: volDir(podUID, "empty-dir", "data")},
		}},
		{name: "a bind by its options only", extra: []specs.Mount{
			{Destination: "/data", Source: volDir(podUID, "empty-dir", "data"), Options: []string{"rbind", "ro"}},
			{Destination: "/scratch", Source: volDir(podUID, "empty-dir", "scratch"), Options: []string{"bind"}},
		}, want: []runtime.Volume{
			{Name: "data", Path: "/data", Dir: volDir(podUID, "empty-dir", "data")},
			{Name: "scratch", Path: "/scratch", Dir: volDir(podUID, "empty-dir", "scratch")},
		}},
		{name: "non-bind mounts are ignored", extra: []specs.Mount{
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
			{Destination: "/srv", Type: "tmpfs", Source: "/srv/data", Options: []string{"size=1m"}},
			{Destination: "/proc2", Type: "proc", Source: "proc"},
		}},
		{name: "hostPath", extra: []specs.Mount{
			bind("/srv/data", "/data"),
		}, wantErr: []string{"host path /srv/data at /data"}},
		{name: "hostPath beside an emptyDir", extra: []specs.Mount{
			bind(volDir(podUID, "empty-dir", "data"), "/data"),
			bind("/var/log", "/host/log"),
		}, wantErr: []string{"host path /var/log at /host/log"}},
		{name: "two refused, both named", extra: []specs.Mount{
			bind("/var/log", "/host/log"),
			bind(volDir(podUID, "local-volume", "pv-local-1"), "/db"),
		}, wantErr: []string{"host path /var/log", `volume "pv-local-1" at /db (local-volume)`}},
		{name: "another pod's emptyDir", extra: []specs.Mount{
			bind(volDir(otherUID, "empty-dir", "data"), "/data"),
		}, wantErr: []string{"host path " + volDir(otherUID, "empty-dir", "data")}},
		{name: "an NFS volume", extra: []specs.Mount{
			bind(volDir(podUID, "nfs", "share"), "/share"),
		}, wantErr: []string{`volume "share" at /share (nfs)`}},
		{name: "a hostPath persistent volume the target shares stays", extra: []specs.Mount{
			bind("/srv/shared/db", "/db"),
			bind(volDir(podUID, "empty-dir", "data"), "/data"),
		}, shared: []string{"/db"},
			want:       []runtime.Volume{{Name: "data", Path: "/data", Dir: volDir(podUID, "empty-dir", "data")}},
			wantShared: []shareddir.Dir{{Source: "/srv/shared/db", Path: "/db"}}},
		{name: "only where the controller said", extra: []specs.Mount{
			bind("/srv/shared/db", "/db"),
			bind("/var/log", "/host/log"),
		}, shared: []string{"/db"}, wantErr: []string{"host path /var/log at /host/log"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := classifyMounts(spec(tt.extra...), podUID, sandboxID, tt.shared)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("classifyMounts accepted it (moving %v), want an error containing %q", m.emptyDirs, tt.wantErr)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("classifyMounts: %v", err)
			}
			if !reflect.DeepEqual(m.emptyDirs, tt.want) {
				t.Errorf("emptyDirs = %+v, want %+v", m.emptyDirs, tt.want)
			}
			if !reflect.DeepEqual(m.shared, tt.wantShared) {
				t.Errorf("shared = %+v, want %+v", m.shared, tt.wantShared)
			}
		})
	}
}

// Without the pod's UID nothing is the pod's: its files are refused as
// host paths, the sandbox's still kept.
func TestClassifyMountsWithoutPodUID(t *testing.T) {
	_, err := classifyMounts(spec(), "", sandboxID, nil)
	if err == nil || !strings.Contains(err.Error(), "host path "+podDir(podUID)+"/etc-hosts") {
		t.Errorf("classifyMounts without a pod UID: %v, want the pod's /etc/hosts refused", err)
	}
	if err != nil && strings.Contains(err.Error(), sandboxID) {
		t.Errorf("classifyMounts without a pod UID refused the sandbox's files: %v", err)
	}
}

func TestClassifyMountsCSIVolume(t *testing.T) {
	_, err := classifyMounts(spec(bind(volDir(podUID, "csi", "pvc-1")+"/mount", "/db")), podUID, sandboxID, nil)
	if err == nil || !strings.Contains(err.Error(), "/db") {
		t.Errorf("classifyMounts of a CSI volume: %v, want it refused", err)
	}
}

func TestClassifyMountsSubPath(t *testing.T) {
	sub := bind(podDir(podUID)+"/volume-subpaths/data/app/0", "/data/app")
	m, err := classifyMounts(spec(sub), podUID, sandboxID, nil)
	if err == nil && len(m.emptyDirs) == 0 {
		t.Errorf("classifyMounts neither moves nor refuses the subPath mount %s", sub.Source)
	}
}

func TestPodVolume(t *testing.T) {
	tests := []struct {
		name, src, uid string
		plugin, vol    string
		ok             bool
	}{
		{name: "emptyDir", src: volDir(podUID, "empty-dir", "data"), uid: podUID, plugin: "kubernetes.io~empty-dir", vol: "data", ok: true},
		{name: "configMap", src: volDir(podUID, "configmap", "conf"), uid: podUID, plugin: "kubernetes.io~configmap", vol: "conf", ok: true},
		{name: "another kubelet root", src: "/data/kubelet/pods/" + podUID + "/volumes/kubernetes.io~empty-dir/x", uid: podUID, plugin: "kubernetes.io~empty-dir", vol: "x", ok: true},
		{name: "another pod's", src: volDir(otherUID, "empty-dir", "data"), uid: podUID},
		{name: "no UID", src: volDir(podUID, "empty-dir", "data"), uid: ""},
		{name: "a UID's prefix", src: volDir(podUID, "empty-dir", "data"), uid: podUID[:8]},
		{name: "nested below the volume", src: volDir(podUID, "csi", "pvc-1") + "/mount", uid: podUID, plugin: "kubernetes.io~csi", vol: "pvc-1", ok: true},
		{name: "a file in a volume", src: volDir(podUID, "configmap", "conf") + "/app.yaml", uid: podUID, plugin: "kubernetes.io~configmap", vol: "conf", ok: true},
		{name: "the plugin's directory", src: podDir(podUID) + "/volumes/kubernetes.io~empty-dir", uid: podUID},
		{name: "no name", src: podDir(podUID) + "/volumes/kubernetes.io~empty-dir/", uid: podUID},
		{name: "the pod's own file", src: podDir(podUID) + "/etc-hosts", uid: podUID},
		{name: "a host path", src: "/srv/data", uid: podUID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plugin, vol, ok := podVolume(tt.src, tt.uid)
			if ok != tt.ok || (ok && (plugin != tt.plugin || vol != tt.vol)) {
				t.Errorf("podVolume(%q, %q) = %q, %q, %v; want %q, %q, %v", tt.src, tt.uid, plugin, vol, ok, tt.plugin, tt.vol, tt.ok)
			}
		})
	}
}

func TestEmptyDirOf(t *testing.T) {
	// The replacement's own spec: a configMap and an emptyDir both
	// named "data" in other pods' or plugins' places, and its own.
	s := spec(
		bind(volDir(podUID, "configmap", "conf"), "/etc/app"),
		bind(volDir(otherUID, "empty-dir", "cache"), "/cache"),
		bind(volDir(podUID, "configmap", "data"), "/etc/data"),
		bind(volDir(podUID, "empty-dir", "data"), "/data"),
	)
	got, err := emptyDirOf(s, podUID, "data")
	if err != nil {
		t.Fatalf("emptyDirOf(data): %v", err)
	}
	if want := volDir(podUID, "empty-dir", "data"); got != want {
		t.Errorf("emptyDirOf(data) = %q, want %q", got, want)
	}
	for _, vol := range []string{"conf", "cache", "missing"} {
		dir, err := emptyDirOf(s, podUID, vol)
		if err == nil {
			t.Errorf("emptyDirOf(%s) = %q, want an error: the replacement has no emptyDir of that name", vol, dir)
		} else if !strings.Contains(err.Error(), strconv.Quote(vol)) {
			t.Errorf("emptyDirOf(%s): %v, want the error to name it", vol, err)
		}
	}
}

func TestKillPendingNoProcess(t *testing.T) {
	for _, pid := range []int{0, -1, 1 << 30} {
		if killPending(pid) {
			t.Errorf("killPending(%d) = true", pid)
		}
	}
	if killPending(os.Getpid()) {
		t.Error("killPending(own PID) = true")
	}
}

// procStatus is a field of /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return ""
}

func maskHas(t *testing.T, mask string, sig syscall.Signal) bool {
	t.Helper()
	m, err := strconv.ParseUint(mask, 16, 64)
	if err != nil {
		t.Fatalf("signal mask %q: %v", mask, err)
	}
	return m&(1<<(uint(sig)-1)) != 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A stopped process with another signal pending (SIGUSR1, caught, so it
// waits in the process's shared pending set) has no SIGKILL pending. A
// pending SIGKILL itself cannot be made here: it kills a stopped process
// at once, and so does cgroup v2's freezer; only a cgroup v1 freezer (or
// an uninterruptible sleep) holds it, and killPending reads /proc itself,
// so its parsing cannot be fed a made-up status without a refactor.
func TestKillPendingOtherSignal(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	cmd := exec.Command(sh, "-c", `trap : USR1; while :; do sleep 1; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	waitFor(t, "the shell's USR1 trap", func() bool { return maskHas(t, procStatus(t, pid, "SigCgt"), syscall.SIGUSR1) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shell to stop", func() bool { return strings.HasPrefix(procStatus(t, pid, "State"), "T") })
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGUSR1 pending", func() bool { return maskHas(t, procStatus(t, pid, "ShdPnd"), syscall.SIGUSR1) })
	if killPending(pid) {
		t.Errorf("killPending = true for a process with only SIGUSR1 pending (ShdPnd %s)", procStatus(t, pid, "ShdPnd"))
	}
}
