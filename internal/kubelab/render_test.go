package kubelab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

func renderConfig(t *testing.T) (Config, layout) {
	t.Helper()
	c, err := testConfig().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c, layout(c.Dir)
}

// dig follows keys through nested maps.
func dig(t *testing.T, m map[string]any, keys ...string) any {
	t.Helper()
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not a table at %q", strings.Join(keys, "."), k)
		}
		if v, ok = mm[k]; !ok {
			t.Fatalf("%s: no %q", strings.Join(keys, "."), k)
		}
	}
	return v
}

// machinePaths are the machine's own containerd's and kubelet's places,
// which a lab node must never use.
var machinePaths = []string{"/run/containerd", "/var/lib/containerd", "/var/lib/kubelet", "/var/run/netns", "/var/lib/cni", "/var/log/pods", "/etc/cni", "/opt/cni"}

func checkNoMachinePaths(t *testing.T, what string, b []byte) {
	t.Helper()
	for _, p := range machinePaths {
		if strings.Contains(string(b), p) {
			t.Errorf("%s mentions %s:\n%s", what, p, b)
		}
	}
}

func TestContainerdConfig(t *testing.T) {
	c, l := renderConfig(t)
	b, err := containerdConfig(c, c.Nodes[1], l)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := toml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	nl := l.node("n2")
	plugins := dig(t, m, "plugins").(map[string]any)
	for _, want := range []struct {
		keys []string
		val  any
	}{
		{[]string{"version"}, int64(4)},
		{[]string{"root"}, nl.containerdRoot()},
		{[]string{"state"}, nl.containerdState()},
		{[]string{"plugins", "io.containerd.server.v1.grpc", "address"}, nl.socket()},
		{[]string{"plugins", "io.containerd.server.v1.ttrpc", "address"}, nl.ttrpcSocket()},
		{[]string{"plugins", "io.containerd.shim.v1.manager", "socket_dir"}, "/tmp/ferry-kt-unit/n2/s"},
		{[]string{"plugins", "io.containerd.nri.v1.nri", "disable"}, true},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "restrict_oom_score_adj"}, true},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "netns_mounts_under_state_dir"}, true},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "runtime_path"}, "/var/cache/ferry/kube/bin/containerd-shim-runc-v2"},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "SystemdCgroup"}, false},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "Root"}, nl.runcRoot()},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "cni", "conf_dir"}, nl.cniConfDir()},
		{[]string{"plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox"}, PauseImage},
	} {
		if got := dig(t, m, want.keys...); got != want.val {
			t.Errorf("%s = %v, want %v", strings.Join(want.keys, "."), got, want.val)
		}
	}
	if len(plugins) == 0 {
		t.Fatal("no plugins")
	}
	if len(nl.shimSockets()) > 42 {
		t.Errorf("shim socket dir %s is longer than containerd allows", nl.shimSockets())
	}
	checkNoMachinePaths(t, "containerd config", b)
}

func TestCNIConfig(t *testing.T) {
	c, l := renderConfig(t)
	b, err := cniConfig(c, c.Nodes[0], l)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPMasq bool   `json:"ipMasq"`
			IPAM   struct {
				Type    string                `json:"type"`
				Ranges  [][]map[string]string `json:"ranges"`
				Routes  []map[string]string   `json:"routes"`
				DataDir string                `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.CNIVersion != "1.0.0" || conf.Name != "ferry-kt-n1" || len(conf.Plugins) != 1 {
		t.Fatalf("%s", b)
	}
	p := conf.Plugins[0]
	if p.Type != "bridge" || p.Bridge != "kbr-n1" || p.IPMasq {
		t.Errorf("bridge plugin %+v", p)
	}
	if p.IPAM.Type != "host-local" || p.IPAM.Ranges[0][0]["subnet"] != "10.92.1.0/24" || p.IPAM.DataDir != l.node("n1").cniIPAM() {
		t.Errorf("ipam %+v", p.IPAM)
	}
	if len(p.IPAM.Routes) != 1 || p.IPAM.Routes[0]["dst"] != "0.0.0.0/0" {
		t.Errorf("routes %v: pods need a default route", p.IPAM.Routes)
	}
}

func TestKubeletConfig(t *testing.T) {
	c, l := renderConfig(t)
	b, err := kubeletConfig(c, c.Nodes[0], l)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"kind":                        "KubeletConfiguration",
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  "/ferry-kt/n1",
		"failCgroupV1":                false,
		"failSwapOn":                  false,
		"podLogsDir":                  l.node("n1").podLogs(),
		"containerRuntimeEndpoint":    "unix://" + l.node("n1").socket(),
		"address":                     "10.91.0.11",
		"imageGCHighThresholdPercent": float64(100),
		"readOnlyPort":                float64(0),
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	for signal, v := range m["evictionHard"].(map[string]any) {
		if v != "0%" {
			t.Errorf("evictionHard %s = %v", signal, v)
		}
	}
	if dig(t, m, "authentication", "anonymous", "enabled") != false || dig(t, m, "authorization", "mode") != "Webhook" {
		t.Error("kubelet API open to anonymous users")
	}
	checkNoMachinePaths(t, "kubelet config", b)

	other, _ := kubeletConfig(c, c.Nodes[1], l)
	var m2 map[string]any
	_ = yaml.Unmarshal(other, &m2)
	for _, key := range []string{"cgroupRoot", "podLogsDir", "containerRuntimeEndpoint", "volumePluginDir", "tlsCertFile"} {
		if m[key] == m2[key] {
			t.Errorf("both nodes have %s %v", key, m[key])
		}
	}
}

func TestComponentArgs(t *testing.T) {
	c, l := renderConfig(t)
	api := apiserverArgs(c, l)
	for _, want := range []string{"apiserver", "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--bind-address=10.91.0.1", "--service-account-signing-key-file=" + l.pki("sa.key"), "--etcd-servers=http://127.0.0.1:2379"} {
		if !slices.Contains(api, want) {
			t.Errorf("apiserver args lack %s: %v", want, api)
		}
	}
	cm := controllerManagerArgs(c, l)
	for _, want := range []string{"controller-manager", "--use-service-account-credentials=true", "--service-account-private-key-file=" + l.pki("sa.key"), "--leader-elect=false"} {
		if !slices.Contains(cm, want) {
			t.Errorf("controller-manager args lack %s", want)
		}
	}
	kl := kubeletArgs(c.Nodes[1], l)
	for _, want := range []string{"kubelet", "--node-ip=10.91.0.12", "--hostname-override=n2", "--root-dir=" + l.node("n2").kubeletRoot()} {
		if !slices.Contains(kl, want) {
			t.Errorf("kubelet args lack %s", want)
		}
	}
	for _, args := range [][]string{api, cm, schedulerArgs(l), kl, etcdArgs(c, l), containerdArgs(c.Nodes[0], l)} {
		checkNoMachinePaths(t, args[0], []byte(strings.Join(args, " ")))
	}
}

func TestKubeconfig(t *testing.T) {
	c, _ := renderConfig(t)
	p, err := newClusterPKI(c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := kubeconfig(c, p.ca.certPEM, NodeUser("n1"), p.nodeClient["n1"])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kc")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://10.91.0.1:6443" || string(rc.CertData) != string(p.nodeClient["n1"].certPEM) || string(rc.CAData) != string(p.ca.certPEM) {
		t.Errorf("kubeconfig: host %s", rc.Host)
	}
}

func TestLayoutStaysInDir(t *testing.T) {
	_, l := renderConfig(t)
	nl := l.node("n1")
	for _, p := range []string{l.state(), l.pki("ca.crt"), l.kubeconfig("admin"), l.etcdData(), l.log("etcd"),
		nl.containerdRoot(), nl.containerdState(), nl.socket(), nl.ttrpcSocket(), nl.nriSocket(), nl.shimSockets(),
		nl.runcRoot(), nl.cniConfDir(), nl.cniIPAM(), nl.kubeletRoot(), nl.podLogs(), nl.volumePlugins()} {
		if !strings.HasPrefix(p, l.dir()+"/") {
			t.Errorf("%s is outside %s", p, l.dir())
		}
	}
}
