package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies m into out.
func (m *Migration) DeepCopyInto(out *Migration) {
	*out = *m
	out.TypeMeta = m.TypeMeta
	m.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if m.Spec.MaxDowntime != nil {
		d := *m.Spec.MaxDowntime
		out.Spec.MaxDowntime = &d
	}
	if m.Status.Report != nil {
		r := *m.Status.Report
		out.Status.Report = &r
	}
	if m.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(m.Status.Conditions))
		for i := range m.Status.Conditions {
			m.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy copies m.
func (m *Migration) DeepCopy() *Migration {
	if m == nil {
		return nil
	}
	out := new(Migration)
	m.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies m as a runtime.Object.
func (m *Migration) DeepCopyObject() runtime.Object { return m.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *MigrationList) DeepCopyInto(out *MigrationList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Migration, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy copies l.
func (l *MigrationList) DeepCopy() *MigrationList {
	if l == nil {
		return nil
	}
	out := new(MigrationList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies l as a runtime.Object.
func (l *MigrationList) DeepCopyObject() runtime.Object { return l.DeepCopy() }
