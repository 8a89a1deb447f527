package kubelab

import "path/filepath"

// layout names every path under Config.Dir, in one place:
//
//	DIR/state.json               what Up made (Down reads it)
//	DIR/pki/                     CA, serving and client certificates, service-account keys
//	DIR/kubeconfig/NAME          admin, controller-manager, scheduler, node-NODE
//	DIR/etcd/                    etcd's data
//	DIR/control/                 the control plane's own scratch (cert dirs)
//	DIR/logs/COMPONENT.log       one log per process
//	DIR/NODE/                    a node: containerd's config, root, state,
//	                             sockets, runc root, CNI config and IPAM
//	                             data, the kubelet's root and pod logs,
//	                             ferry's shim's rendezvous (restore/)
type layout string

func (l layout) dir() string                  { return string(l) }
func (l layout) state() string                { return filepath.Join(string(l), "state.json") }
func (l layout) pki(file string) string       { return filepath.Join(string(l), "pki", file) }
func (l layout) kubeconfig(who string) string { return filepath.Join(string(l), "kubeconfig", who) }
func (l layout) etcdData() string             { return filepath.Join(string(l), "etcd") }
func (l layout) control(sub string) string    { return filepath.Join(string(l), "control", sub) }
func (l layout) logs() string                 { return filepath.Join(string(l), "logs") }
func (l layout) log(component string) string {
	return filepath.Join(string(l), "logs", component+".log")
}
func (l layout) node(name string) nodeLayout { return nodeLayout(filepath.Join(string(l), name)) }

// nodeLayout is one node's directory.
type nodeLayout string

func (n nodeLayout) path(parts ...string) string {
	return filepath.Join(append([]string{string(n)}, parts...)...)
}
func (n nodeLayout) containerdConfig() string { return n.path("containerd.toml") }
func (n nodeLayout) containerdRoot() string   { return n.path("containerd", "root") }
func (n nodeLayout) containerdState() string  { return n.path("containerd", "state") }
func (n nodeLayout) containerdTemp() string   { return n.path("containerd", "tmp") }
func (n nodeLayout) containerdOpt() string    { return n.path("containerd", "opt") }
func (n nodeLayout) socket() string           { return n.path("containerd.sock") }
func (n nodeLayout) ttrpcSocket() string      { return n.path("containerd.sock.ttrpc") }
func (n nodeLayout) nriSocket() string        { return n.path("nri.sock") }

// shimSockets is short on purpose: containerd refuses a shim socket
// directory longer than 42 characters.
func (n nodeLayout) shimSockets() string   { return n.path("s") }
func (n nodeLayout) runcRoot() string      { return n.path("runc") }
func (n nodeLayout) cniConfDir() string    { return n.path("cni", "net.d") }
func (n nodeLayout) cniIPAM() string       { return n.path("cni", "ipam") }
func (n nodeLayout) kubeletRoot() string   { return n.path("kubelet") }
func (n nodeLayout) kubeletCerts() string  { return n.path("kubelet", "pki") }
func (n nodeLayout) kubeletConfig() string { return n.path("kubelet.yaml") }
func (n nodeLayout) podLogs() string       { return n.path("pod-logs") }
func (n nodeLayout) volumePlugins() string { return n.path("volume-plugins") }
func (n nodeLayout) cdiSpecs() string      { return n.path("cdi") }
func (n nodeLayout) restoreDir() string    { return n.path("restore") }
