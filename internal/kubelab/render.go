package kubelab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// Ports the control plane serves on, inside ControlNetNS (a namespace of
// the cluster's own, so the defaults cannot clash), and the kubelet's.
const (
	apiserverPort         = 6443
	etcdClientPort        = 2379
	etcdPeerPort          = 2380
	controllerManagerPort = 10257
	schedulerPort         = 10259
	kubeletPort           = 10250
	kubeletHealthzPort    = 10248
)

// apiserverURL is where everyone reaches the apiserver.
func apiserverURL(c Config) string { return fmt.Sprintf("https://%s:%d", c.ControlIP, apiserverPort) }

func etcdURL(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }

// cniNetworkName names node n's CNI network: containerd keys its CNI
// result cache (in /var/lib/cni, shared by the machine) by it.
func cniNetworkName(c Config, n Node) string { return c.Name + "-" + n.Name }

// cgroupParent is the cgroup, in every hierarchy, that holds all the
// cluster's processes; node n's kubelet puts its pods under nodeCgroupRoot
// and the daemons run in daemonsCgroup.
func cgroupParent(c Config) string                { return "/" + c.Name }
func nodeCgroupRoot(c Config, node string) string { return cgroupParent(c) + "/" + node }
func daemonsCgroup(c Config) string               { return cgroupParent(c) + "/daemons" }

// etcdArgs runs a single etcd member on loopback: only the apiserver,
// beside it in ControlNetNS, talks to it.
func etcdArgs(c Config, l layout) []string {
	return []string{
		"--name=kubelab",
		"--data-dir=" + l.etcdData(),
		"--listen-client-urls=" + etcdURL(etcdClientPort),
		"--advertise-client-urls=" + etcdURL(etcdClientPort),
		"--listen-peer-urls=" + etcdURL(etcdPeerPort),
		"--initial-advertise-peer-urls=" + etcdURL(etcdPeerPort),
		"--initial-cluster=kubelab=" + etcdURL(etcdPeerPort),
		"--initial-cluster-state=new",
		// A lab cluster is thrown away, never recovered after a power cut:
		// no fsync keeps its disk writes from slowing the machine.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
}

func apiserverArgs(c Config, l layout) []string {
	return []string{
		"apiserver",
		"--etcd-servers=" + etcdURL(etcdClientPort),
		"--bind-address=" + c.ControlIP,
		"--advertise-address=" + c.ControlIP,
		fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--cert-dir=" + l.control("apiserver"),
		"--tls-cert-file=" + l.pki("apiserver.crt"),
		"--tls-private-key-file=" + l.pki("apiserver.key"),
		"--client-ca-file=" + l.pki("ca.crt"),
		"--kubelet-client-certificate=" + l.pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + l.pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + l.pki("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + l.pki("sa.pub"),
		"--service-account-signing-key-file=" + l.pki("sa.key"),
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		// Aggregation: requests the apiserver forwards carry their user in
		// headers, trusted by the front-proxy CA. The controller-manager
		// and the scheduler read this CA too, to authenticate requests.
		"--requestheader-client-ca-file=" + l.pki("front-proxy-ca.crt"),
		"--requestheader-allowed-names=" + frontProxyUser,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + l.pki("front-proxy-client.crt"),
		"--proxy-client-key-file=" + l.pki("front-proxy-client.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
	}
}

func controllerManagerArgs(c Config, l layout) []string {
	kc := l.kubeconfig("controller-manager")
	return []string{
		"controller-manager",
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", controllerManagerPort),
		"--cert-dir=" + l.control("controller-manager"),
		"--leader-elect=false",
		"--controllers=*",
		// Each controller acts with its own service account's rights, as
		// in a real cluster, which also needs the service-account token
		// machinery (the signing key) working.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + l.pki("sa.key"),
		"--root-ca-file=" + l.pki("ca.crt"),
		"--cluster-signing-cert-file=" + l.pki("ca.crt"),
		"--cluster-signing-key-file=" + l.pki("ca.key"),
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--allocate-node-cidrs=false",
		// Its default, /usr/libexec/kubernetes/..., it would create.
		"--flex-volume-plugin-dir=" + l.control("flex-volume"),
		"--cluster-name=" + c.Name,
		"--profiling=false",
	}
}

func schedulerArgs(l layout) []string {
	kc := l.kubeconfig("scheduler")
	return []string{
		"scheduler",
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", schedulerPort),
		"--cert-dir=" + l.control("scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	}
}

func kubeletArgs(n Node, l layout) []string {
	nl := l.node(n.Name)
	return []string{
		"kubelet",
		"--config=" + nl.kubeletConfig(),
		"--kubeconfig=" + l.kubeconfig("node-"+n.Name),
		"--root-dir=" + nl.kubeletRoot(),
		"--cert-dir=" + nl.kubeletCerts(),
		"--hostname-override=" + n.Name,
		// The node's namespace has no default route, from which the
		// kubelet would otherwise pick its address.
		"--node-ip=" + n.IP,
	}
}

func containerdArgs(n Node, l layout) []string {
	return []string{"--config=" + l.node(n.Name).containerdConfig()}
}

// containerdConfig is node n's containerd configuration (version 4): every
// path, socket and runc root its own, so several containerds (and the
// machine's own, in /run/containerd and /var/lib/containerd) never meet.
func containerdConfig(c Config, n Node, l layout) ([]byte, error) {
	nl := l.node(n.Name)
	cfg := map[string]any{
		"version": 4,
		"root":    nl.containerdRoot(),
		"state":   nl.containerdState(),
		"temp":    nl.containerdTemp(),
		"plugins": map[string]any{
			// In version 4 the servers are plugins; one left out would take
			// its default address in /run/containerd.
			"io.containerd.server.v1.grpc":  map[string]any{"address": nl.socket()},
			"io.containerd.server.v1.ttrpc": map[string]any{"address": nl.ttrpcSocket()},
			"io.containerd.internal.v1.opt": map[string]any{"path": nl.containerdOpt()},
			"io.containerd.nri.v1.nri":      map[string]any{"disable": true, "socket_path": nl.nriSocket()},
			"io.containerd.shim.v1.manager": map[string]any{"socket_dir": nl.shimSockets()},
			"io.containerd.cri.v1.runtime": map[string]any{
				// This machine withholds CAP_SYS_RESOURCE: runc cannot
				// lower a container's oom_score_adj below containerd's own,
				// and every sandbox would fail.
				"restrict_oom_score_adj": true,
				// Pod network namespaces pinned under the state directory,
				// not in the machine's /var/run/netns.
				"netns_mounts_under_state_dir": true,
				"cdi_spec_dirs":                []string{nl.cdiSpecs()},
				"containerd": map[string]any{
					"default_runtime_name": "runc",
					"runtimes": map[string]any{
						// RuntimeClass ferry: a replacement pod's container
						// is restored by ferry's shim (api/restoreshim),
						// which reads the restore annotation from the spec.
						ShimHandler: map[string]any{
							"runtime_type":    "io.containerd.runc.v2",
							"runtime_path":    filepath.Join(c.Bin, ShimBinary),
							"pod_annotations": []string{"ferry.dev/*"},
							"options": map[string]any{
								"SystemdCgroup": false,
								"Root":          nl.runcRoot(),
							},
						},
						"runc": map[string]any{
							"runtime_type": "io.containerd.runc.v2",
							// The machine's own shim is on PATH: name ours.
							"runtime_path": filepath.Join(c.Bin, "containerd-shim-runc-v2"),
							"options": map[string]any{
								"SystemdCgroup": false,
								// The shim's default runc root is the machine's.
								"Root": nl.runcRoot(),
							},
						},
					},
				},
				"cni": map[string]any{
					"bin_dirs":     []string{c.CNIBin},
					"conf_dir":     nl.cniConfDir(),
					"max_conf_num": 1,
				},
			},
			"io.containerd.cri.v1.images": map[string]any{
				"pinned_images": map[string]any{"sandbox": PauseImage},
			},
			"io.containerd.grpc.v1.cri": map[string]any{
				"stream_server_address": "127.0.0.1",
				"stream_server_port":    "0",
			},
		},
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// cniConfig is node n's CNI network: a bridge of the node's own, addresses
// from its PodCIDR, IPAM state in the node's directory. No masquerade:
// pods reach other nodes' pods by the routes Up adds.
func cniConfig(c Config, n Node, l layout) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       cniNetworkName(c, n),
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      n.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": n.PodCIDR}}},
					// Without it pods get no default route.
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": l.node(n.Name).cniIPAM(),
				},
			},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfiguration is the part of kubelet.config.k8s.io/v1beta1 the
// lab sets; the kubelet decodes strictly, so names must be exact.
type kubeletConfiguration struct {
	Kind                        string            `json:"kind"`
	APIVersion                  string            `json:"apiVersion"`
	Address                     string            `json:"address"`
	Port                        int               `json:"port"`
	ReadOnlyPort                int               `json:"readOnlyPort"`
	HealthzBindAddress          string            `json:"healthzBindAddress"`
	HealthzPort                 int               `json:"healthzPort"`
	TLSCertFile                 string            `json:"tlsCertFile"`
	TLSPrivateKeyFile           string            `json:"tlsPrivateKeyFile"`
	Authentication              kubeletAuthn      `json:"authentication"`
	Authorization               kubeletAuthz      `json:"authorization"`
	ContainerRuntimeEndpoint    string            `json:"containerRuntimeEndpoint"`
	CgroupDriver                string            `json:"cgroupDriver"`
	CgroupRoot                  string            `json:"cgroupRoot"`
	CgroupsPerQOS               bool              `json:"cgroupsPerQOS"`
	FailCgroupV1                bool              `json:"failCgroupV1"`
	FailSwapOn                  bool              `json:"failSwapOn"`
	OOMScoreAdj                 int               `json:"oomScoreAdj"`
	PodLogsDir                  string            `json:"podLogsDir"`
	VolumePluginDir             string            `json:"volumePluginDir"`
	EvictionHard                map[string]string `json:"evictionHard"`
	ImageGCHighThresholdPercent int               `json:"imageGCHighThresholdPercent"`
	ImageGCLowThresholdPercent  int               `json:"imageGCLowThresholdPercent"`
	ClusterDomain               string            `json:"clusterDomain"`
	ResolvConf                  string            `json:"resolvConf"`
	RotateCertificates          bool              `json:"rotateCertificates"`
	ServerTLSBootstrap          bool              `json:"serverTLSBootstrap"`
	RegisterNode                bool              `json:"registerNode"`
	RuntimeRequestTimeout       string            `json:"runtimeRequestTimeout"`
}

type kubeletAuthn struct {
	Anonymous struct {
		Enabled bool `json:"enabled"`
	} `json:"anonymous"`
	Webhook struct {
		Enabled bool `json:"enabled"`
	} `json:"webhook"`
	X509 struct {
		ClientCAFile string `json:"clientCAFile"`
	} `json:"x509"`
}

type kubeletAuthz struct {
	Mode string `json:"mode"`
}

// kubeletConfig is node n's KubeletConfiguration.
func kubeletConfig(c Config, n Node, l layout) ([]byte, error) {
	nl := l.node(n.Name)
	k := kubeletConfiguration{
		Kind:               "KubeletConfiguration",
		APIVersion:         "kubelet.config.k8s.io/v1beta1",
		Address:            n.IP,
		Port:               kubeletPort,
		ReadOnlyPort:       0,
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        kubeletHealthzPort,
		TLSCertFile:        l.pki("kubelet-serving-" + n.Name + ".crt"),
		TLSPrivateKeyFile:  l.pki("kubelet-serving-" + n.Name + ".key"),
		Authorization:      kubeletAuthz{Mode: "Webhook"},
		// The unix:// scheme: a bare path is deprecated.
		ContainerRuntimeEndpoint: "unix://" + nl.socket(),
		CgroupDriver:             "cgroupfs",
		// A replacement pod's Start waits in ferry's shim for the
		// migration's switchover: longer than the default 2 minutes.
		RuntimeRequestTimeout: RestoreWait.String(),
		// Kubelets share the machine's cgroup hierarchies: each needs a
		// root of its own, made before it starts.
		CgroupRoot:    nodeCgroupRoot(c, n.Name),
		CgroupsPerQOS: true,
		FailCgroupV1:  false,
		FailSwapOn:    false,
		// The kubelet may not lower its own score without
		// CAP_SYS_RESOURCE: leave it.
		OOMScoreAdj: 0,
		// A kubelet removes pod log directories of pods it does not know:
		// never share one.
		PodLogsDir:      nl.podLogs(),
		VolumePluginDir: nl.volumePlugins(),
		// Every kubelet sees the one disk: no evictions, no image GC.
		EvictionHard: map[string]string{
			"memory.available":  "0%",
			"nodefs.available":  "0%",
			"nodefs.inodesFree": "0%",
			"imagefs.available": "0%",
		},
		ImageGCHighThresholdPercent: 100,
		ImageGCLowThresholdPercent:  99,
		ClusterDomain:               "cluster.local",
		ResolvConf:                  "",
		RegisterNode:                true,
	}
	k.Authentication.Anonymous.Enabled = false
	k.Authentication.Webhook.Enabled = true
	k.Authentication.X509.ClientCAFile = l.pki("ca.crt")
	return yaml.Marshal(k)
}

// kubeconfig is a kubeconfig for user, the cluster's CA and user's
// credentials embedded, so that the file stands alone.
func kubeconfig(c Config, caPEM []byte, user string, creds keyPair) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: apiserverURL(c), CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: creds.certPEM, ClientKeyData: creds.keyPEM}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: user}
	cfg.CurrentContext = c.Name
	return clientcmd.Write(*cfg)
}

// commandLine joins argv for a log line.
func commandLine(argv []string) string { return strings.Join(argv, " ") }
