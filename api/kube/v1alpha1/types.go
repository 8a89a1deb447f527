// Package v1alpha1 is ferry's Kubernetes API, group ferry.dev: the
// Migration resource, which asks ferry to move a pod's container to
// another node live, and says what became of it. ferry's controller
// (cmd/ferry-controller) reconciles it; deploy/kubernetes holds its
// CustomResourceDefinition.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phases of a Migration, in the order they come; Succeeded, Failed and
// Aborted are final.
const (
	PhasePending = "Pending" // accepted, not yet checked
	// PhaseTargetPod: the replacement pod is being made on the target
	// node; its container waits in ferry's shim.
	PhaseTargetPod = "TargetPod"
	// PhaseMigrating: the source node's agent moves the container (rounds,
	// the freeze, the restore into the replacement, the commit).
	PhaseMigrating = "Migrating"
	// PhaseSwitching: committed; the replacement takes the source pod's
	// place (its owner adopts it) and the source pod is deleted.
	PhaseSwitching = "Switching"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"  // the source pod runs on, or the reason says where it is
	PhaseAborted   = "Aborted" // cancelled before the commit: the source pod runs on
)

// Finalizer holds a Migration until its migration has ended, so that
// deleting it first cancels what it drives.
const Finalizer = "ferry.dev/migration"

// Migration moves one pod's container to another node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
type Migration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MigrationSpec   `json:"spec"`
	Status MigrationStatus `json:"status,omitempty"`
}

// MigrationSpec says which pod moves, where and how.
type MigrationSpec struct {
	// PodName is the pod, in the Migration's namespace.
	PodName string `json:"podName"`
	// Container names the pod's container; empty for a pod of one.
	Container string `json:"container,omitempty"`
	// TargetNode is where it goes; empty: the controller picks the Ready
	// node with the most free memory that is not the source.
	TargetNode string `json:"targetNode,omitempty"`
	// Mode is ferry's technique: auto (the default), cold, precopy,
	// postcopy or hybrid.
	Mode string `json:"mode,omitempty"`
	// MaxDowntime is the downtime budget pre-copy's rounds and auto aim
	// for (e.g. 200ms).
	MaxDowntime *metav1.Duration `json:"maxDowntime,omitempty"`
	// Hold stops the migration once its replacement pod is made, before
	// anything is frozen, until Hold is set false (e.g. to watch
	// both addresses, or to pick the moment). The replacement's container
	// waits in ferry's shim meanwhile, at most the shim's wait (10 minutes
	// by default), after which the migration fails.
	Hold bool `json:"hold,omitempty"`
	// Cancel asks to stop the migration; before the commit the source pod
	// runs on as before (so does deleting the Migration).
	Cancel bool `json:"cancel,omitempty"`
}

// MigrationStatus says where the migration is and what it measured.
type MigrationStatus struct {
	Phase   string `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	// SourceNode and SourcePod are where the container was; TargetNode
	// and TargetPod where it goes (the replacement pod).
	SourceNode string `json:"sourceNode,omitempty"`
	SourcePod  string `json:"sourcePod,omitempty"`
	TargetNode string `json:"targetNode,omitempty"`
	TargetPod  string `json:"targetPod,omitempty"`
	// TargetPodIP is the replacement pod's address, once it runs.
	TargetPodIP string `json:"targetPodIP,omitempty"`
	// TargetReason says why the target node was chosen, where the spec
	// named none (each node's room, price and predicted downtime weighed
	// by the source node's agent, as ferry follow weighs hosts).
	TargetReason string `json:"targetReason,omitempty"`
	// ContainerID is the source container's containerd ID.
	ContainerID string `json:"containerID,omitempty"`
	// MaxFrozenMs is how long the source container may stay frozen: its
	// liveness probe's tolerance, timeoutSeconds + (failureThreshold-1) ×
	// periodSeconds, after which the kubelet restarts it; 0 without a
	// probe. A mode predicted to hold it longer is refused before the
	// freeze (auto picks another).
	MaxFrozenMs int64 `json:"maxFrozenMs,omitempty"`
	// SharedMounts are where the container mounts persistent volumes
	// whose storage the target node shares (hostPath persistent volumes
	// admitting it, ReadWriteMany or ReadOnlyMany): nothing of them is
	// copied, and the target's agent checks, before the freeze, that the
	// same storage is there.
	SharedMounts []string `json:"sharedMounts,omitempty"`
	// JobID is the migration's job at the source node's agent (ferry ps,
	// ferry cancel there).
	JobID string `json:"jobID,omitempty"`
	// Report is what the migration measured, as `ferry migrate --json`
	// reports it.
	Report *Report `json:"report,omitempty"`
	// Conditions: Ready is true once the replacement serves.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Report is the part of ferry's report (docs/report.schema.json) a
// Migration keeps.
type Report struct {
	Mode        string  `json:"mode"`
	DowntimeMs  float64 `json:"downtimeMs"`
	TotalMs     float64 `json:"totalMs"`
	FrozenMs    float64 `json:"frozenMs,omitempty"`
	BytesSent   int64   `json:"bytesSent"`
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Rounds      int     `json:"rounds,omitempty"`
	// SourceState is what became of the source's copy (removed, resumed,
	// frozen); Network what the move did to the pod's address.
	SourceState string `json:"sourceState,omitempty"`
	Network     string `json:"network,omitempty"`
	Error       string `json:"error,omitempty"`
}

// MigrationList is a list of Migrations.
//
// +kubebuilder:object:root=true
type MigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Migration `json:"items"`
}

// Final says whether phase is an end.
func Final(phase string) bool {
	return phase == PhaseSucceeded || phase == PhaseFailed || phase == PhaseAborted
}
