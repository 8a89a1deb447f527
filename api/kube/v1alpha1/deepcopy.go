package v1alpha1

import (
	"slices"

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
	out.Status.SharedMounts = slices.Clone(m.Status.SharedMounts)
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

// DeepCopyInto copies p into out.
func (p *FollowPolicy) DeepCopyInto(out *FollowPolicy) {
	*out = *p
	out.TypeMeta = p.TypeMeta
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	s, o := &p.Spec, &out.Spec
	if s.Selector != nil {
		o.Selector = make(map[string]string, len(s.Selector))
		for k, v := range s.Selector {
			o.Selector[k] = v
		}
	}
	o.Nodes = append([]string(nil), s.Nodes...)
	o.Ports = append([]int(nil), s.Ports...)
	for _, d := range []struct{ from, to **metav1.Duration }{
		{&s.Threshold, &o.Threshold}, {&s.Dwell, &o.Dwell}, {&s.MinInterval, &o.MinInterval},
		{&s.Interval, &o.Interval}, {&s.MaxDowntime, &o.MaxDowntime},
	} {
		if *d.from != nil {
			v := **d.from
			*d.to = &v
		}
	}
	if s.Hysteresis != nil {
		h := *s.Hysteresis
		o.Hysteresis = &h
	}
	if p.Status.LastMove != nil {
		out.Status.LastMove = p.Status.LastMove.DeepCopy()
	}
	if p.Status.Pending != nil {
		pd := *p.Status.Pending
		p.Status.Pending.At.DeepCopyInto(&pd.At)
		out.Status.Pending = &pd
	}
}

// DeepCopy copies p.
func (p *FollowPolicy) DeepCopy() *FollowPolicy {
	if p == nil {
		return nil
	}
	out := new(FollowPolicy)
	p.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies p as a runtime.Object.
func (p *FollowPolicy) DeepCopyObject() runtime.Object { return p.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *FollowPolicyList) DeepCopyInto(out *FollowPolicyList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]FollowPolicy, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy copies l.
func (l *FollowPolicyList) DeepCopy() *FollowPolicyList {
	if l == nil {
		return nil
	}
	out := new(FollowPolicyList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies l as a runtime.Object.
func (l *FollowPolicyList) DeepCopyObject() runtime.Object { return l.DeepCopy() }
