package kubecontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ferry-migrate/ferry/api"
	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// AnnotationFaults on a Migration lists faults to inject (package fault:
// ACTION@PHASE, comma-separated), for tests: only agents started with
// --allow-faults honour them.
const AnnotationFaults = "ferry.dev/faults"

// phaseCleanup is the source's phase once the destination has committed:
// the source copy, frozen, waits for its pod to be deleted.
const phaseCleanup = "cleanup"

// follow makes sure this process follows m's job: it asks the source's
// agent for the migration under m's job ID (the agent starts it, or
// follows the one it has), hands the pod over once the agent reaches its
// cleanup, and records the end. Once per Migration per process.
func (r *Reconciler) follow(m *v1.Migration) {
	r.mu.Lock()
	if r.following == nil {
		r.following = map[types.UID]bool{}
	}
	if r.following[m.UID] {
		r.mu.Unlock()
		return
	}
	r.following[m.UID] = true
	r.mu.Unlock()
	key := client.ObjectKeyFromObject(m)
	go func() {
		defer func() {
			r.mu.Lock()
			delete(r.following, m.UID)
			r.mu.Unlock()
		}()
		r.run(context.Background(), key, m.DeepCopy())
	}()
}

// run follows the job to its end, retrying while the agent cannot be
// reached (the job goes on without its client).
func (r *Reconciler) run(ctx context.Context, key types.NamespacedName, m *v1.Migration) {
	lg := log.FromContext(ctx).WithValues("migration", key, "job", m.Status.JobID)
	req := api.Request{ID: m.Status.JobID, Container: m.Status.ContainerID, Mode: m.Spec.Mode, Runtime: "kubernetes"}
	if req.Mode == "" {
		req.Mode = api.ModeAuto
	}
	if f := m.Annotations[AnnotationFaults]; f != "" {
		req.Faults = strings.Split(f, ",")
	}
	if m.Spec.MaxDowntime != nil {
		req.Precopy.MaxDowntime = m.Spec.MaxDowntime.Duration
	}
	req.MaxFrozen = time.Duration(m.Status.MaxFrozenMs) * time.Millisecond
	if len(m.Status.SharedMounts) > 0 {
		req.SetRuntimeOption("kubernetes", api.KubernetesOptionShared, strings.Join(m.Status.SharedMounts, ","))
	}
	switched := m.Status.Phase == v1.PhaseSwitching
	for attempt := 0; ; attempt++ {
		src, err := r.Agents.Of(ctx, r.Client, m.Status.SourceNode)
		if err == nil {
			var dst agentclient.Endpoint
			if dst, err = r.Agents.Of(ctx, r.Client, m.Status.TargetNode); err == nil {
				req.To = dst.Name + "@" + dst.Addr
				var rep api.Report
				rep, err = agentclient.MigrateJob(ctx, src, req, nil, func(p api.Progress) {
					if p.Phase == phaseCleanup && !switched {
						switched = r.handOver(ctx, key) == nil
					}
				})
				if err == nil && rep.InDoubtID != "" && rep.Settled == "" {
					rep.Settled, err = r.settle(ctx, key, src, rep.InDoubtID)
				}
				if err == nil {
					r.ended(ctx, key, rep)
					return
				}
				if transport.IsRemote(err) {
					// The agent answered with an error instead of a job
					// (bad input, or it cannot start one): nothing began.
					r.finish(ctx, key, v1.PhaseFailed, "the source node's agent: "+err.Error(), nil)
					return
				}
			}
		}
		lg.Error(err, "following the migration; trying again")
		time.Sleep(min(time.Duration(attempt+1)*time.Second, 10*time.Second))
	}
}

// settle waits for the source's agent to settle a migration left in
// doubt (it asks the destination, which may have restored the container):
// the source's copy stays frozen and the replacement stays until then.
func (r *Reconciler) settle(ctx context.Context, key types.NamespacedName, src agentclient.Endpoint, id string) (string, error) {
	noted := false
	for {
		res, err := agentclient.Resolve(ctx, src, id)
		if err != nil {
			return "", err
		}
		if res.Settled {
			return res.State, nil
		}
		if !noted {
			var m v1.Migration
			if r.Client.Get(ctx, key, &m) == nil {
				noted = r.setPhase(ctx, &m, m.Status.Phase, "in doubt: the source's copy stays frozen until its agent learns what became of the destination's copy ("+res.Note+")") == nil
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// handOver moves the Migration to Switching and the pod's place to the
// replacement.
func (r *Reconciler) handOver(ctx context.Context, key types.NamespacedName) error {
	var m v1.Migration
	if err := r.Client.Get(ctx, key, &m); err != nil {
		return err
	}
	if m.Status.Phase != v1.PhaseSwitching {
		if err := r.setPhase(ctx, &m, v1.PhaseSwitching, fmt.Sprintf("committed: pod %s on %s runs the container; deleting the source pod %s", m.Status.TargetPod, m.Status.TargetNode, m.Status.SourcePod)); err != nil {
			return err
		}
	}
	err := r.switchOver(ctx, &m)
	if err != nil {
		log.FromContext(ctx).Error(err, "handing the pod over", "migration", key)
	}
	return err
}

// ended records the job's report: Succeeded once committed (the pod's
// place handed over), Aborted when cancelled before the commit, Failed
// otherwise.
func (r *Reconciler) ended(ctx context.Context, key types.NamespacedName, rep api.Report) {
	committed := rep.OK || rep.Settled == "removed" || slices.ContainsFunc(rep.Phases, func(p api.PhaseSpan) bool { return p.Name == phaseCleanup })
	if rep.Settled != "" {
		rep.SourceState = rep.Settled
	}
	kr := summary(rep)
	switch {
	case committed:
		var err error
		for range 10 {
			if err = r.handOver(ctx, key); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		msg := fmt.Sprintf("moved in %.0f ms, %.0f ms of downtime (%s)", rep.TotalMs, rep.DowntimeMs, rep.Mode)
		if rep.Error != "" {
			msg += "; after the commit: " + rep.Error
		}
		if err != nil {
			msg += "; handing the pod over: " + err.Error()
		}
		r.finish(ctx, key, v1.PhaseSucceeded, msg, kr)
	case strings.Contains(rep.Error, "cancelled"):
		r.finish(ctx, key, v1.PhaseAborted, fmt.Sprintf("cancelled before the commit: the source pod runs on (its copy %s)", sourceState(rep)), kr)
	default:
		r.finish(ctx, key, v1.PhaseFailed, fmt.Sprintf("%s (the source's copy: %s)", rep.Error, sourceState(rep)), kr)
	}
}

// sourceState is what became of the source's copy, as the report says;
// it says nothing of a copy never frozen.
func sourceState(rep api.Report) string {
	if rep.SourceState == "" {
		return "never frozen"
	}
	return rep.SourceState
}

// finish records a final phase on the current Migration.
func (r *Reconciler) finish(ctx context.Context, key types.NamespacedName, phase, msg string, rep *v1.Report) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var m v1.Migration
		if err := r.Client.Get(ctx, key, &m); err != nil {
			return err
		}
		return r.end(ctx, &m, phase, msg, rep)
	})
	if err != nil {
		log.FromContext(ctx).Error(err, "recording the end", "migration", key, "phase", phase)
	}
}

// summary is the part of a report a Migration keeps.
func summary(rep api.Report) *v1.Report {
	kr := &v1.Report{Mode: rep.Mode, DowntimeMs: rep.DowntimeMs, TotalMs: rep.TotalMs, FrozenMs: rep.FrozenMs,
		BytesSent: rep.BytesSent, MemoryBytes: rep.MemoryBytes, Rounds: len(rep.Rounds), SourceState: rep.SourceState, Error: rep.Error}
	for _, n := range rep.Networks {
		kr.Network = n.Outcome
	}
	return kr
}
