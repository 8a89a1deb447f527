package kubelab

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestFailingChecks(t *testing.T) {
	report := "[+]ping ok\n[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\n[+]log ok\n[-]etcd failed: reason withheld\n[-]\nreadyz check failed"
	if got := failingChecks(report); got != "poststarthook/rbac/bootstrap-roles, etcd" {
		t.Errorf("failingChecks = %q", got)
	}
	if got := failingChecks("ok"); got != "" {
		t.Errorf("failingChecks(ok) = %q", got)
	}
}

func TestNodeSchedulable(t *testing.T) {
	node := func(ready corev1.ConditionStatus, taints ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		if ready != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletNotReady"}}
		}
		for _, k := range taints {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
		}
		return n
	}
	for name, tc := range map[string]struct {
		node *corev1.Node
		want string // "" for schedulable, else part of the error
	}{
		"ready":                  {node(corev1.ConditionTrue), ""},
		"no condition yet":       {node(""), "no Ready condition"},
		"not ready":              {node(corev1.ConditionFalse), "Ready=False"},
		"ready, still tainted":   {node(corev1.ConditionTrue, corev1.TaintNodeNotReady), "tainted"},
		"ready, unrelated taint": {node(corev1.ConditionTrue, "example.com/x"), ""},
	} {
		err := nodeSchedulable(tc.node)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
