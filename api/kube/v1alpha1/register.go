package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is ferry.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "ferry.dev", Version: "v1alpha1"}

// AddToScheme adds the group's types to a scheme (only apimachinery
// here: a client imports this package without controller-runtime).
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Migration{}, &MigrationList{}, &FollowPolicy{}, &FollowPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
