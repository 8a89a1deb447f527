package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ferry-migrate/ferry/internal/runresult"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/kubedrain"
	"github.com/ferry-migrate/ferry/internal/kubelab"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// migrateKubernetes is Migrate for --runtime kubernetes: a lab with its
// Kubernetes cluster and ferry installed (kubeworld), each run a memhog
// Deployment whose pod a Migration moves from h1 to h2 while the probe on
// h3 polls it through the pod network; right after each, the same
// migration of a plain containerd container in the same lab (res.Against,
// runtime containerd), so the two share the machine's drift; and once,
// the delete-and-recreate a user would otherwise do.
func migrateKubernetes(ctx context.Context, o MigrateOptions) (res MigrateResult, err error) {
	if err := kubelab.CheckCache(kubelab.Config{}); err != nil {
		return res, fmt.Errorf("--runtime kubernetes needs the Kubernetes lab's binaries (scripts/kube-build.sh): %w", err)
	}
	if len(o.Baselines) > 0 || o.TCPClient || (o.Network != "" && o.Network != "host") || o.VolumeBytes > 0 || o.Paths > 1 || o.AgainstMemoryBytes > 0 {
		return res, fmt.Errorf("--runtime kubernetes compares with plain containerd and Kubernetes' delete-and-recreate itself: no --baseline, --tcp-client, --network, --volume, --paths or --against-memory")
	}
	bins := filepath.Dir(o.FerryBin)
	ctlBin := filepath.Join(bins, "ferry-controller")
	if _, err := os.Stat(ctlBin); err != nil {
		return res, fmt.Errorf("%s is missing: run `make build` (it builds ferry-controller next to ferry)", ctlBin)
	}
	res = o.emptyResult()
	plain := o
	plain.Runtime = "containerd"
	pr := plain.emptyResult()
	res.Against = &pr
	o.logf("bringing up a 3-host lab with Kubernetes (bandwidth %d bit/s)", o.BandwidthBps)
	l, down, err := upLab(ctx, lab.Options{Hosts: 3, BandwidthBps: o.BandwidthBps, FerryBin: o.FerryBin, Kubernetes: true})
	if err != nil {
		return res, err
	}
	defer down(&err)
	dir, err := os.MkdirTemp("", "ferry-bench-kube")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	w, err := kubeworld.Install(ctx, l, filepath.Join(bins, "memhog"), ctlBin, dir)
	if err != nil {
		return res, err
	}
	defer w.Close()
	if err := l.ImportWorkloadImage(ctx, "containerd", l.Hosts[0].Name, l.Hosts[1].Name); err != nil {
		return res, err
	}
	for i := 0; i < o.Repeat; i++ {
		o.logf("run %d/%d: %s migration of a pod of %d MiB at %d pages/s", i+1, o.Repeat, o.Mode, o.MemoryBytes>>20, o.DirtyRate)
		r := o.kubeRunOnce(ctx, w, fmt.Sprintf("memhog-%d", i+1))
		o.logf("run %d/%d: downtime %.0f ms, client downtime %.0f ms, total %.0f ms, state_ok=%v %s", i+1, o.Repeat, r.DowntimeMs, r.ClientDowntimeMs, r.TotalMs, r.StateOK, r.Error)
		res.Runs = append(res.Runs, r)
		o.logf("run %d/%d, plain containerd", i+1, o.Repeat)
		c := plain.RunOnce(ctx, l, &l.Hosts[0], &l.Hosts[1], &l.Hosts[2], fmt.Sprintf("memhog-c%d", i+1))
		o.logf("run %d/%d, plain containerd: downtime %.0f ms, client downtime %.0f ms, total %.0f ms, state_ok=%v %s", i+1, o.Repeat, c.DowntimeMs, c.ClientDowntimeMs, c.TotalMs, c.StateOK, c.Error)
		res.Against.Runs = append(res.Against.Runs, c)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	res.Summarize()
	res.Against.Summarize()
	if res.Against.MedianClientDowntimeMs > 0 {
		res.ClientDowntimeVsContainerd = res.MedianClientDowntimeMs / res.Against.MedianClientDowntimeMs
	}
	o.logf("Kubernetes' own way: the pod deleted, its Deployment making it again on the other node")
	rb := o.recreateOnce(ctx, w)
	o.logf("recreate: client downtime %.0f ms, state_ok=%v %s", rb.ClientDowntimeMs, rb.StateOK, rb.Error)
	res.Baselines.Recreate = &rb
	if rb.ClientDowntimeMs > 0 {
		res.ClientDowntimeVsRecreate = res.MedianClientDowntimeMs / rb.ClientDowntimeMs
	}
	return res, nil
}

// kubeRunOnce moves one memhog Deployment's pod by a Migration: held
// until the probe polls both the pod and its replacement, then released.
func (o MigrateOptions) kubeRunOnce(ctx context.Context, w *kubeworld.World, name string) (r Run) {
	defer func() { _ = w.DeleteDeployment(context.WithoutCancel(ctx), name) }()
	// From h1 to h2, as the containerd run beside it: the pod is made
	// with h2 cordoned.
	uncordon, err := cordon(ctx, w, w.Lab.Hosts[1].Name, true)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	src, err := w.Memhog(ctx, name, strconv.FormatInt(o.MemoryBytes, 10), o.DirtyRate, workloadPort)
	uncordon()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	var p *ProbeProc
	m := &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.MigrationSpec{PodName: src.Name, Mode: o.Mode, Hold: true, TargetNode: w.Lab.Hosts[1].Name}}
	if o.Precopy.MaxDowntime > 0 {
		m.Spec.MaxDowntime = &metav1.Duration{Duration: o.Precopy.MaxDowntime}
	}
	got, err := w.Migrate(ctx, m, func(m *v1.Migration) error {
		if p != nil || !kubeworld.Held(m) {
			return nil
		}
		ip, err := w.SandboxAddress(ctx, m.Status.TargetNode, m.Status.TargetPod)
		if err != nil {
			return err
		}
		addrs := []string{fmt.Sprintf("%s:%d", src.Status.PodIP, workloadPort), fmt.Sprintf("%s:%d", ip, workloadPort)}
		if p, _, err = StartProbe(ctx, &w.Lab.Hosts[2], o.FerryBin, addrs, o.readyTimeout()); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // the dirty rate steady, answers before the freeze
		return w.Release(ctx, m)
	})
	if p != nil {
		time.Sleep(300 * time.Millisecond) // answers after the switch
		pr, perr := p.Stop()
		if perr != nil && err == nil {
			err = perr
		}
		r.ClientDowntimeMs, r.StateOK, r.ProbeReason = pr.ClientDowntimeMs, pr.StateOK, pr.Reason
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	// The whole report, phases and all, is the source agent's job's.
	cdt, sok, reason := r.ClientDowntimeMs, r.StateOK, r.ProbeReason
	if h, err := w.Lab.Host(got.Status.SourceNode); err == nil && got.Status.JobID != "" {
		if rep, err := agentclient.Wait(ctx, agentclient.Socket(h.ControlSock), got.Status.JobID, nil); err == nil {
			r = runresult.RunOf(rep)
		}
	}
	r.ClientDowntimeMs, r.StateOK, r.ProbeReason = cdt, sok, reason
	r.OK = got.Status.Phase == v1.PhaseSucceeded
	if !r.OK {
		r.Error = got.Status.Phase + ": " + got.Status.Message
	}
	return r
}

// recreateOnce measures the delete-and-recreate: the pod's node cordoned,
// the pod deleted, its Deployment's new pod on the other node answering.
func (o MigrateOptions) recreateOnce(ctx context.Context, w *kubeworld.World) (b RecreateBaseline) {
	const name = "memhog-recreate"
	defer func() { _ = w.DeleteDeployment(context.WithoutCancel(ctx), name) }()
	src, err := w.Memhog(ctx, name, strconv.FormatInt(o.MemoryBytes, 10), o.DirtyRate, workloadPort)
	if err != nil {
		b.Error = err.Error()
		return b
	}
	node := src.Spec.NodeName
	uncordon, err := cordon(ctx, w, node, true)
	if err != nil {
		b.Error = err.Error()
		return b
	}
	defer uncordon()
	p, _, err := StartProbe(ctx, &w.Lab.Hosts[2], o.FerryBin, []string{fmt.Sprintf("%s:%d", src.Status.PodIP, workloadPort)}, o.readyTimeout())
	if err != nil {
		b.Error = err.Error()
		return b
	}
	_, _ = p.Stop()
	start := time.Now()
	zero := int64(0)
	if err := w.Clientset.CoreV1().Pods(kubeworld.Namespace).Delete(ctx, src.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		b.Error = err.Error()
		return b
	}
	var ip string
	err = kubeworld.Wait(ctx, 3*time.Minute, "the new pod running", func() error {
		pods, err := w.Pods(ctx, name)
		if err != nil {
			return err
		}
		if len(pods) == 1 && pods[0].Name != src.Name && pods[0].Status.PodIP != "" {
			ip = pods[0].Status.PodIP
			return nil
		}
		return fmt.Errorf("pods %v", kubeworld.PodNames(pods))
	})
	if err == nil {
		p, _, err = StartProbe(ctx, &w.Lab.Hosts[2], o.FerryBin, []string{fmt.Sprintf("%s:%d", ip, workloadPort)}, o.readyTimeout())
	}
	if err != nil {
		b.Error = err.Error()
		return b
	}
	b.ClientDowntimeMs = float64(time.Since(start).Microseconds()) / 1000
	_, _ = p.Stop()
	// Its memory was made afresh: nothing of the old pod's state is there.
	b.StateOK = false
	return b
}

// cordon marks node (un)schedulable and returns the undo.
func cordon(ctx context.Context, w *kubeworld.World, node string, on bool) (func(), error) {
	if err := kubedrain.Cordon(ctx, w.Client, node, on); err != nil {
		return nil, err
	}
	return func() { _ = kubedrain.Cordon(ctx, w.Client, node, !on) }, nil
}
