// Package restoreshim is the rendezvous between ferry's containerd shim
// (containerd-shim-ferry-v2, RuntimeClass ferry) and the ferry agent on
// the same node, for a Kubernetes pod that is a migrated container's
// replacement.
//
// The kubelet creates the replacement pod as any other; its container
// carries the annotation Annotation (passed from the pod by containerd's
// pod_annotations), whose value is the Key: the source container's ID.
// The shim's Create then turns the container into one restored from a
// checkpoint (CRIU images at Dir/KEY/images, CRIU's work directory at
// Dir/KEY/work), writes Dir/KEY/container.json (Created) and listens on
// Dir/KEY/shim.sock. Its Start waits there. The agent, once the source
// has dumped, points images and work at the migration's own directories
// (symbolic links), connects, and sends one Request; the shim answers one
// Reply after runc's restore returned, or with its error. Start fails,
// and nothing is restored, when the agent asks to abort, when the
// container is killed or deleted first, or after the wait's bound.
//
// Nothing but the standard library: the shim is a module of its own.
package restoreshim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"time"
)

// Annotation marks a pod (and so its containers' specs) as a migrated
// container's replacement; its value is the Key.
const Annotation = "ferry.dev/restore"

// DirEnv names the environment variable that sets the rendezvous
// directory for a shim (containerd passes its own environment to the
// shims it starts); DefaultDir when unset.
const (
	DirEnv     = "FERRY_RESTORE_DIR"
	DefaultDir = "/run/ferry/restore"
)

// WaitEnv bounds how long Start waits for the agent (a Go duration);
// DefaultWait when unset. Keep it below the kubelet's
// runtimeRequestTimeout, or the kubelet gives up on Start first.
const (
	WaitEnv     = "FERRY_RESTORE_WAIT"
	DefaultWait = 10 * time.Minute
)

// Names of the files in a key's directory.
const (
	CreatedFile = "container.json"
	SocketFile  = "shim.sock"
	ImagesLink  = "images"
	WorkLink    = "work"
)

var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckKey refuses a key that is not a plain name (it becomes a path).
func CheckKey(key string) error {
	if !keyPattern.MatchString(key) {
		return fmt.Errorf("restore key %q: want letters, digits, '.', '_' or '-' (at most 128, not starting with a dot)", key)
	}
	return nil
}

// KeyDir is the directory of key under the rendezvous directory dir. A
// long key (a containerd ID is 64 hex digits) is shortened there, its
// start and a digest of the whole: the socket's path must fit a unix
// socket address (107 bytes).
func KeyDir(dir, key string) string {
	if len(key) > 40 {
		sum := sha256.Sum256([]byte(key))
		key = key[:24] + "-" + hex.EncodeToString(sum[:])[:15]
	}
	return filepath.Join(dir, key)
}

// Created is what the shim tells of the container it created.
type Created struct {
	// ID is containerd's ID of the replacement container; Namespace its
	// containerd namespace (k8s.io under the CRI).
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	// Bundle is its OCI bundle; its config.json is the spec runc
	// restores with.
	Bundle string `json:"bundle"`
	// ShimPID is the shim's process, so a reader can tell a stale file.
	ShimPID int `json:"shim_pid"`
}

// Request is the agent's one message to a waiting Start.
type Request struct {
	// CRIUConfig is a CRIU configuration file for the restore (leave
	// stopped, lazy pages, TCP), set as the spec's org.criu.config
	// annotation before runc restores.
	CRIUConfig string `json:"criu_config,omitempty"`
	// Abort, if set, fails Start with this reason; nothing is restored.
	Abort string `json:"abort,omitempty"`
}

// Reply is the shim's one answer: the restored init's PID, or why not.
type Reply struct {
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// Ask sends req on conn and reads the reply, within timeout.
func Ask(conn net.Conn, req Request, timeout time.Duration) (Reply, error) {
	var rep Reply
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return rep, err
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return rep, fmt.Errorf("restore shim: send: %w", err)
	}
	if err := json.NewDecoder(conn).Decode(&rep); err != nil {
		return rep, fmt.Errorf("restore shim: no answer: %w", err)
	}
	return rep, nil
}

// Answer reads the request on conn (within timeout) and hands it to do,
// whose reply it sends back.
func Answer(conn net.Conn, timeout time.Duration, do func(Request) Reply) error {
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var req Request
	if err := json.NewDecoder(conn).Decode(&req); err != nil {
		return fmt.Errorf("restore shim: bad request: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return json.NewEncoder(conn).Encode(do(req))
}
