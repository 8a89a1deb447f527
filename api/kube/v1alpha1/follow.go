package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FollowPolicy makes a pod follow its clients: ferry's controller samples
// the latency its clients see from the node it runs on and, when it stays
// above Threshold for Dwell, weighs the other nodes (their latency to the
// clients, room, price and predicted downtime: ferry follow's policy) and
// moves the pod to the cheapest node that is clearly nearer, by a
// Migration it owns.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
type FollowPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FollowPolicySpec   `json:"spec"`
	Status FollowPolicyStatus `json:"status,omitempty"`
}

// FollowPolicySpec says which pod follows its clients, and how eagerly.
type FollowPolicySpec struct {
	// Selector picks the pod, in the policy's namespace, by its labels
	// (matchLabels): exactly one pod must match, as for a Deployment of
	// one replica whose pod is renamed by each move.
	Selector map[string]string `json:"selector"`
	// Nodes it may run on (empty: every node).
	Nodes []string `json:"nodes,omitempty"`
	// Threshold is the latency above which its clients are too far
	// (default 30ms); Dwell how long it must stay so (default 10s);
	// Hysteresis the band below Threshold, as a share of it, a sample must
	// fall into to count as near again (default 0.2); MinInterval the
	// least time between two moves (default 1m).
	Threshold   *metav1.Duration `json:"threshold,omitempty"`
	Dwell       *metav1.Duration `json:"dwell,omitempty"`
	Hysteresis  *float64         `json:"hysteresis,omitempty"`
	MinInterval *metav1.Duration `json:"minInterval,omitempty"`
	// Interval is the time between latency samples (default 1s).
	Interval *metav1.Duration `json:"interval,omitempty"`
	// Ports are the pod's listening ports whose connections are its
	// clients (empty: every inbound connection); Probe an address (IP for
	// ICMP echo, IP:PORT for TCP connects) each node measures instead,
	// for a service without long-lived connections.
	Ports []int  `json:"ports,omitempty"`
	Probe string `json:"probe,omitempty"`
	// MaxDowntime is the downtime budget: a node whose predicted downtime
	// exceeds it is no candidate.
	MaxDowntime *metav1.Duration `json:"maxDowntime,omitempty"`
	// Suspend stops the sampling (the pod stays where it is).
	Suspend bool `json:"suspend,omitempty"`
}

// FollowPolicyStatus says where the pod is and what was decided last.
type FollowPolicyStatus struct {
	// Node and Pod are where the followed pod runs.
	Node string `json:"node,omitempty"`
	Pod  string `json:"pod,omitempty"`
	// LatencyMs is the last latency sampled from Node.
	LatencyMs float64 `json:"latencyMs,omitempty"`
	// Moves counts the moves made; LastMove is when the last one ended.
	Moves    int          `json:"moves,omitempty"`
	LastMove *metav1.Time `json:"lastMove,omitempty"`
	// Pending is the move under way: its Migration, in this namespace.
	Pending *FollowPending `json:"pending,omitempty"`
	// Decision is the last decision's reason (each candidate weighed);
	// Message what happened last (an error included).
	Decision string `json:"decision,omitempty"`
	Message  string `json:"message,omitempty"`
}

// FollowPending is a move asked for whose end is not yet known.
type FollowPending struct {
	ID        string      `json:"id"`
	From      string      `json:"from"`
	To        string      `json:"to"`
	Mode      string      `json:"mode,omitempty"`
	At        metav1.Time `json:"at"`
	Migration string      `json:"migration"`
}

// FollowPolicyList is a list of FollowPolicies.
//
// +kubebuilder:object:root=true
type FollowPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FollowPolicy `json:"items"`
}
