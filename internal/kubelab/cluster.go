package kubelab

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ferry-migrate/ferry/api/restoreshim"
	deploy "github.com/ferry-migrate/ferry/deploy/kubernetes"
	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// Paths fixed in the kubelet, whatever its root directory: every kubelet
// links its containers' logs in containerLogsDir, and serves device
// plugins' registrations at devicePluginSocket, beside its checkpoint of
// their devices.
const (
	containerLogsDir   = "/var/log/containers"
	devicePluginDir    = "/var/lib/kubelet/device-plugins"
	devicePluginSocket = devicePluginDir + "/kubelet.sock"
)

// machineDirs are the machine-wide directories the kubelets make, parents
// first.
var machineDirs = []string{containerLogsDir, filepath.Dir(devicePluginDir), devicePluginDir}

// Cluster is a cluster Up brought up.
type Cluster struct {
	cfg    Config
	layout layout
	rest   *rest.Config
	client kubernetes.Interface
}

// Up brings a cluster up as c says and returns once every node is Ready
// (and schedulable) and the default namespace has its service account, so
// that pods can be created at once. Each wait is bounded by
// c.ReadyTimeout; an error names the component and its log.
//
// Whatever Up made stays when it fails, for its logs to be read: call
// Down(c.Dir) in every case.
func Up(ctx context.Context, c Config) (*Cluster, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("kubelab: needs root (cgroups, network namespaces, containerd)")
	}
	if err := CheckCache(c); err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	for _, ns := range append([]string{c.ControlNetNS}, nodeNetNSes(c)...) {
		if _, err := os.Stat(ns); err != nil {
			return nil, fmt.Errorf("kubelab: network namespace: %w", err)
		}
	}
	if err := checkNoSystemKubelet(); err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	l := layout(filepath.Clean(c.Dir))
	if _, err := os.Stat(l.state()); err == nil {
		return nil, fmt.Errorf("kubelab: %s already holds a cluster: Down it first", c.Dir)
	}
	u := &upper{cfg: c, layout: l}
	if err := u.prepare(); err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	if err := u.run(ctx); err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	return &Cluster{cfg: c, layout: l, rest: u.rest, client: u.client}, nil
}

// Attach is the cluster c describes, which Up brought up before (another
// process may have): a client through its admin's kubeconfig.
func Attach(c Config) (*Cluster, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	l := layout(filepath.Clean(c.Dir))
	if _, err := os.Stat(l.state()); err != nil {
		return nil, fmt.Errorf("kubelab: no cluster in %s: %w", c.Dir, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig("admin"))
	if err != nil {
		return nil, fmt.Errorf("kubelab: %w", err)
	}
	cfg.Dial = Dialer(c.ControlNetNS)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{cfg: c, layout: l, rest: cfg, client: cs}, nil
}

// checkNoSystemKubelet refuses to run beside a kubelet of the machine's
// own: the lab's kubelets would take its device-plugin socket over (the
// path is fixed in the kubelet), and it would remove their log links.
func checkNoSystemKubelet() error {
	conn, err := net.DialTimeout("unix", devicePluginSocket, time.Second)
	if err != nil {
		return nil
	}
	conn.Close()
	return fmt.Errorf("a kubelet already serves %s: the lab's kubelets would take that socket (its path is fixed) from it", devicePluginSocket)
}

// socketInode is the inode of the socket at path, or 0 when there is none.
func socketInode(path string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0
	}
	return st.Ino
}

func nodeNetNSes(c Config) []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.NetNS)
	}
	return out
}

// upper is one Up at work.
type upper struct {
	cfg    Config
	layout layout
	state  *state
	pki    *clusterPKI
	rest   *rest.Config
	client kubernetes.Interface
}

// prepare writes every file the components read: certificates,
// kubeconfigs and configurations; and records the state's first facts.
func (u *upper) prepare() error {
	c, l := u.cfg, u.layout
	dirs := []string{l.dir(), l.logs(), filepath.Dir(l.kubeconfig("x")), l.etcdData(), l.control("apiserver"), l.control("controller-manager"), l.control("scheduler")}
	for _, n := range c.Nodes {
		nl := l.node(n.Name)
		dirs = append(dirs, nl.containerdRoot(), nl.containerdState(), nl.containerdTemp(), nl.containerdOpt(),
			nl.shimSockets(), nl.runcRoot(), nl.cniConfDir(), nl.cniIPAM(), nl.kubeletRoot(), nl.kubeletCerts(),
			nl.podLogs(), nl.volumePlugins(), nl.cdiSpecs())
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	u.state = &state{path: l.state(), Name: c.Name, CgroupParent: cgroupParent(c)}
	if err := u.state.update(func(*state) {}); err != nil {
		return err
	}

	var err error
	if u.pki, err = newClusterPKI(c, time.Now()); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if err := u.pki.write(l); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	kubeconfigs := map[string]struct {
		user  string
		creds keyPair
	}{
		"admin":              {adminUser, u.pki.admin},
		"controller-manager": {controllerManagerUser, u.pki.controllerManager},
		"scheduler":          {schedulerUser, u.pki.scheduler},
	}
	for _, n := range c.Nodes {
		kubeconfigs["node-"+n.Name] = struct {
			user  string
			creds keyPair
		}{NodeUser(n.Name), u.pki.nodeClient[n.Name]}
	}
	for name, k := range kubeconfigs {
		b, err := kubeconfig(c, u.pki.ca.certPEM, k.user, k.creds)
		if err == nil {
			err = os.WriteFile(l.kubeconfig(name), b, 0o600)
		}
		if err != nil {
			return fmt.Errorf("kubeconfig %s: %w", name, err)
		}
	}
	for _, n := range c.Nodes {
		nl := l.node(n.Name)
		for _, f := range []struct {
			path   string
			render func(Config, Node, layout) ([]byte, error)
		}{
			{nl.containerdConfig(), containerdConfig},
			{filepath.Join(nl.cniConfDir(), "10-"+cniNetworkName(c, n)+".conflist"), cniConfig},
			{nl.kubeletConfig(), kubeletConfig},
		} {
			b, err := f.render(c, n, l)
			if err == nil {
				err = os.WriteFile(f.path, b, 0o600)
			}
			if err != nil {
				return fmt.Errorf("node %s: %s: %w", n.Name, filepath.Base(f.path), err)
			}
		}
	}
	u.rest = &rest.Config{
		Host: apiserverURL(c),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: u.pki.ca.certPEM, CertData: u.pki.admin.certPEM, KeyData: u.pki.admin.keyPEM,
		},
		Dial:    Dialer(c.ControlNetNS),
		QPS:     50,
		Burst:   100,
		Timeout: 30 * time.Second,
	}
	u.client, err = kubernetes.NewForConfig(u.rest)
	return err
}

// run makes the machine-wide pieces (cgroups, routes) and starts the
// components, each once what it needs is ready.
func (u *upper) run(ctx context.Context) error {
	// Waits still running when one fails end with it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, l, st := u.cfg, u.layout, u.state
	var missing []string
	for _, d := range machineDirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, d)
		}
	}
	err := st.update(func(s *state) {
		s.MadeMachineDirs = missing
		for _, n := range c.Nodes {
			s.NodeCgroupRoots = append(s.NodeCgroupRoots, nodeCgroupRoot(c, n.Name))
			s.Bridges = append(s.Bridges, bridge{NetNS: n.NetNS, Name: n.Bridge})
			s.CNINetworks = append(s.CNINetworks, cniNetworkName(c, n))
			s.KubeletNetNS = append(s.KubeletNetNS, n.NetNS)
		}
	})
	if err != nil {
		return err
	}
	// The kubelet checks that its cgroup root exists in every v1
	// hierarchy it uses, with CPUs and memory nodes in cpuset.
	for _, rel := range append([]string{daemonsCgroup(c)}, st.NodeCgroupRoots...) {
		if err := cgroups.Make(rel); err != nil {
			return err
		}
	}
	if err := u.network(); err != nil {
		return err
	}
	apiService, err := firstServiceIP(c.ServiceCIDR)
	if err != nil {
		return err
	}
	for _, ns := range st.KubeletNetNS {
		if err := serveAPIService(ctx, ns, apiService, net.JoinHostPort(c.ControlIP, strconv.Itoa(apiserverPort))); err != nil {
			return err
		}
	}

	etcd, err := startDaemon(c, l, st, "etcd", c.ControlNetNS, append([]string{filepath.Join(c.Bin, "etcd")}, etcdArgs(c, l)...))
	if err != nil {
		return err
	}
	containerds := map[string]*daemon{}
	for _, n := range c.Nodes {
		argv := append([]string{filepath.Join(c.Bin, "containerd")}, containerdArgs(n, l)...)
		env := []string{restoreshim.DirEnv + "=" + l.node(n.Name).restoreDir(), restoreshim.WaitEnv + "=" + (RestoreWait - time.Minute).String()}
		if containerds[n.Name], err = startDaemon(c, l, st, "containerd-"+n.Name, n.NetNS, argv, env...); err != nil {
			return err
		}
	}

	// containerd comes up (and takes the pause image) while the control
	// plane does.
	nodesReady, nctx := errgroup.WithContext(ctx)
	for _, n := range c.Nodes {
		d := containerds[n.Name]
		nodesReady.Go(func() error {
			sock := l.node(n.Name).socket()
			err := waitReady(nctx, "containerd on node "+n.Name, c.ReadyTimeout, []*daemon{d}, func(ctx context.Context) error {
				_, err := u.ctr(ctx, sock, "version")
				return err
			})
			if err != nil {
				return err
			}
			if _, err := u.ctr(nctx, sock, "images", "import", c.PauseImageTar); err != nil {
				return fmt.Errorf("containerd on node %s: import %s: %w (log: %s)", n.Name, c.PauseImageTar, err, d.Log)
			}
			return nil
		})
	}

	etcdHTTP := &http.Client{Transport: &http.Transport{DialContext: Dialer(c.ControlNetNS)}}
	err = waitReady(ctx, "etcd", c.ReadyTimeout, []*daemon{etcd}, func(ctx context.Context) error {
		return httpOK(ctx, etcdHTTP, etcdURL(etcdClientPort)+"/health", `"health":"true"`)
	})
	if err != nil {
		return err
	}
	ferryKube := filepath.Join(c.Bin, "ferry-kube")
	apiserver, err := startDaemon(c, l, st, "apiserver", c.ControlNetNS, append([]string{ferryKube}, apiserverArgs(c, l)...))
	if err != nil {
		return err
	}
	err = waitReady(ctx, "kube-apiserver", c.ReadyTimeout, []*daemon{apiserver, etcd}, func(ctx context.Context) error {
		body, err := u.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if failing := failingChecks(string(body)); err != nil && failing != "" {
			return fmt.Errorf("/readyz: failing %s", failing)
		}
		return err
	})
	if err != nil {
		return err
	}
	cm, err := startDaemon(c, l, st, "controller-manager", c.ControlNetNS, append([]string{ferryKube}, controllerManagerArgs(c, l)...))
	if err != nil {
		return err
	}
	sched, err := startDaemon(c, l, st, "scheduler", c.ControlNetNS, append([]string{ferryKube}, schedulerArgs(l)...))
	if err != nil {
		return err
	}
	if err := nodesReady.Wait(); err != nil {
		return err
	}
	// The kubelets start one at a time: each removes whatever is in the
	// machine-wide device-plugin directory and binds its socket there, and
	// two doing that at once fail one of them with EADDRINUSE. A kubelet
	// that binds after another only unlinks the other's socket, which keeps
	// listening.
	kubelets := map[string]*daemon{}
	for _, n := range c.Nodes {
		before := socketInode(devicePluginSocket)
		argv := append([]string{ferryKube}, kubeletArgs(n, l)...)
		kl, err := startDaemon(c, l, st, "kubelet-"+n.Name, n.NetNS, argv)
		if err != nil {
			return err
		}
		kubelets[n.Name] = kl
		err = waitReady(ctx, "kubelet on node "+n.Name+" (device-plugin socket)", c.ReadyTimeout, []*daemon{kl, containerds[n.Name]}, func(context.Context) error {
			if ino := socketInode(devicePluginSocket); ino == 0 || ino == before {
				return fmt.Errorf("%s not yet bound by this kubelet", devicePluginSocket)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}

	// Health of the two control loops (self-signed, on loopback in
	// ControlNetNS: nothing to verify).
	localTLS := &http.Client{Transport: &http.Transport{
		DialContext:     Dialer(c.ControlNetNS),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	for _, w := range []struct {
		what string
		d    *daemon
		port int
	}{{"kube-controller-manager", cm, controllerManagerPort}, {"kube-scheduler", sched, schedulerPort}} {
		err := waitReady(ctx, w.what, c.ReadyTimeout, []*daemon{w.d}, func(ctx context.Context) error {
			return httpOK(ctx, localTLS, fmt.Sprintf("https://127.0.0.1:%d/healthz", w.port), "ok")
		})
		if err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		kl, cd := kubelets[n.Name], containerds[n.Name]
		nodeHTTP := &http.Client{Transport: &http.Transport{DialContext: Dialer(n.NetNS)}}
		err := waitReady(ctx, "kubelet on node "+n.Name, c.ReadyTimeout, []*daemon{kl, cd}, func(ctx context.Context) error {
			return httpOK(ctx, nodeHTTP, fmt.Sprintf("http://127.0.0.1:%d/healthz", kubeletHealthzPort), "ok")
		})
		if err != nil {
			return err
		}
		err = waitReady(ctx, "node "+n.Name+" Ready", c.ReadyTimeout, []*daemon{kl, cd, cm}, func(ctx context.Context) error {
			node, err := u.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return nodeSchedulable(node)
		})
		if err != nil {
			return err
		}
	}
	// RuntimeClass ferry, as the manifest a cluster operator applies.
	b, err := deploy.Manifests.ReadFile(deploy.RuntimeClass)
	if err != nil {
		return err
	}
	var rc nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(b, &rc); err != nil {
		return fmt.Errorf("%s: %w", deploy.RuntimeClass, err)
	}
	if _, err := u.client.NodeV1().RuntimeClasses().Create(ctx, &rc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("RuntimeClass %s: %w", rc.Name, err)
	}
	return waitReady(ctx, "service account default/default", c.ReadyTimeout, []*daemon{cm}, func(ctx context.Context) error {
		_, err := u.client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// network readies the namespaces: loopback up (the components' health
// endpoints are there) and routes that carry each node's pod CIDR to it,
// from every other node and from the control plane.
func (u *upper) network() error {
	c := u.cfg
	for _, ns := range append([]string{c.ControlNetNS}, nodeNetNSes(c)...) {
		if err := linkUp(ns, "lo"); err != nil {
			return err
		}
	}
	var routes []route
	for _, dst := range c.Nodes {
		for _, ns := range append([]string{c.ControlNetNS}, nodeNetNSes(c)...) {
			if ns != dst.NetNS {
				routes = append(routes, route{NetNS: ns, Dst: dst.PodCIDR, Via: dst.IP})
			}
		}
	}
	if err := u.state.update(func(s *state) { s.Routes = append(s.Routes, routes...) }); err != nil {
		return err
	}
	for _, r := range routes {
		if err := addRoute(r); err != nil {
			return err
		}
	}
	return nil
}

// nodeSchedulable is nil once node is Ready and no longer carries the
// not-ready taint the node lifecycle controller removes after that.
func nodeSchedulable(node *corev1.Node) error {
	ready := false
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status != corev1.ConditionTrue {
				return fmt.Errorf("node %s: Ready=%s (%s: %s)", node.Name, cond.Status, cond.Reason, cond.Message)
			}
			ready = true
		}
	}
	if !ready {
		return fmt.Errorf("node %s: no Ready condition yet", node.Name)
	}
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return fmt.Errorf("node %s: still tainted %s", node.Name, t.Key)
		}
	}
	return nil
}

// failingChecks lists the checks a /readyz or /healthz report marks
// failed ("[-]NAME failed: ..."), "" when none.
func failingChecks(report string) string {
	var failed []string
	for _, line := range strings.Split(report, "\n") {
		if name, ok := strings.CutPrefix(line, "[-]"); ok && len(strings.Fields(name)) > 0 {
			failed = append(failed, strings.Fields(name)[0])
		}
	}
	return strings.Join(failed, ", ")
}

// httpOK gets url and wants status 200 and a body that contains want.
func httpOK(ctx context.Context, client *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// ctr runs the cache's ctr against the containerd at sock, in the
// namespace the CRI uses.
func (u *upper) ctr(ctx context.Context, sock string, args ...string) ([]byte, error) {
	return runCtr(ctx, u.cfg, sock, args...)
}

func runCtr(ctx context.Context, c Config, sock string, args ...string) ([]byte, error) {
	argv := append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(c.Bin, "ctr"), argv...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Kubeconfig is the path of an administrator's kubeconfig (certificates
// embedded). Use it from inside the lab's namespaces, e.g. through
// nsenter --net=CONTROLNETNS.
func (c *Cluster) Kubeconfig() string { return c.layout.kubeconfig("admin") }

// RESTConfig is an administrator's client configuration whose connections
// are made in the control plane's network namespace, usable from any
// namespace.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Client is an administrator's clientset, built on RESTConfig.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// Dir is the cluster's directory, for Down.
func (c *Cluster) Dir() string { return c.layout.dir() }

// Log is component's log: "etcd", "apiserver", "controller-manager",
// "scheduler", "containerd-NODE" or "kubelet-NODE".
func (c *Cluster) Log(component string) string { return c.layout.log(component) }

// NodeSocket is the containerd socket (the kubelet's runtime) of node of
// the cluster in dir; NodeShimDir its ferry shim's rendezvous directory
// (restoreshim.DirEnv). A ferry agent on the node takes both.
func NodeSocket(dir, node string) string  { return layout(filepath.Clean(dir)).node(node).socket() }
func NodeShimDir(dir, node string) string { return layout(filepath.Clean(dir)).node(node).restoreDir() }

// PodLogs is the directory where node's kubelet keeps its pods' container
// logs (NAMESPACE_POD_UID/CONTAINER/N.log).
func (c *Cluster) PodLogs(node string) string { return c.layout.node(node).podLogs() }

// CgroupRoot is node's kubelet cgroup root (relative to each hierarchy):
// its pods' cgroups are below it.
func (c *Cluster) CgroupRoot(node string) string { return nodeCgroupRoot(c.cfg, node) }

// ImportImage loads an OCI image-layout archive into every node's
// containerd, where the kubelet finds it for pods with imagePullPolicy
// Never (or IfNotPresent).
func (c *Cluster) ImportImage(ctx context.Context, tarPath string) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, n := range c.cfg.Nodes {
		g.Go(func() error {
			if _, err := runCtr(gctx, c.cfg, c.layout.node(n.Name).socket(), "images", "import", tarPath); err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// ImportBinary packs a static binary as the image ref (the binary at
// /NAME, the entrypoint NAME and args) and imports it into every node.
func (c *Cluster) ImportBinary(ctx context.Context, ref, binary string, args ...string) error {
	tarPath := filepath.Join(c.layout.dir(), "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := os.MkdirAll(filepath.Dir(tarPath), 0o700); err != nil {
		return err
	}
	argv := append([]string{"image", "--ref", ref, "--out", tarPath, binary}, args...)
	if out, err := exec.CommandContext(ctx, filepath.Join(c.cfg.Bin, "ferry-kube"), argv...).CombinedOutput(); err != nil {
		return fmt.Errorf("pack %s as %s: %w: %s", binary, ref, err, strings.TrimSpace(string(out)))
	}
	return c.ImportImage(ctx, tarPath)
}

// Down removes the cluster: Down(c.Dir()).
func (c *Cluster) Down() error { return Down(c.layout.dir()) }
