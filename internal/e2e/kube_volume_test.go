package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/kubeworld"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// TestKubernetesSharedPersistentVolume: a pod whose persistent volume is
// storage every node shares at the same host path (a hostPath
// ReadWriteMany volume on the lab's shared storage) moves pre-copy with
// its volume left where it is: memhog writes its journal there throughout,
// and its check (memory and journal) holds at the target; the Migration
// names the shared mount. The same pod on a ReadWriteOnce volume is
// refused before anything is frozen, the reason naming the volume.
func TestKubernetesSharedPersistentVolume(t *testing.T) {
	w := upKubeWorld(t)
	ctx := context.Background()
	core := w.Clientset.CoreV1()
	for _, c := range []struct {
		name  string
		modes []corev1.PersistentVolumeAccessMode
	}{
		{"shared", []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}},
		{"once", []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
	} {
		dir := filepath.Join(lab.SharedStorage, "pv-"+c.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		empty := ""
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + c.name}, Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   c.modes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		}}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-" + c.name, Namespace: kubeworld.Namespace}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: c.modes, VolumeName: pv.Name, StorageClassName: &empty,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}}
		if _, err := core.PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := core.PersistentVolumeClaims(kubeworld.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := "memhog-pv-" + c.name
		d := kubeworld.MemhogDeployment(name, "64M", 200, memhogPortNum)
		spec := &d.Spec.Template.Spec
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}})
		ctr := &spec.Containers[0]
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
		ctr.Command = append(ctr.Command, "--journal", "/data/journal", "--journal-rate", "64K")
		src, err := w.Run(ctx, d)
		t.Cleanup(func() { _ = w.DeleteDeployment(context.Background(), name) })
		if err != nil {
			t.Fatal(err)
		}
		m := w.migrate(t, &v1.Migration{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + c.name},
			Spec: v1.MigrationSpec{PodName: src.Name, Mode: "precopy", TargetNode: other(src.Spec.NodeName)}}, nil)
		if c.name == "once" {
			if m.Status.Phase != v1.PhaseFailed || !strings.Contains(m.Status.Message, `volume "data"`) || !strings.Contains(m.Status.Message, "ReadWriteMany") {
				t.Fatalf("ReadWriteOnce: %s: %s; want Failed, the volume and the access mode named", m.Status.Phase, m.Status.Message)
			}
			t.Logf("ReadWriteOnce refused: %s", m.Status.Message)
			w.checkUntouched(t, src)
			continue
		}
		if m.Status.Phase != v1.PhaseSucceeded || !slices.Equal(m.Status.SharedMounts, []string{"/data"}) {
			t.Fatalf("shared: %s: %s (shared mounts %v)", m.Status.Phase, m.Status.Message, m.Status.SharedMounts)
		}
		pods := w.pods(t, name)
		if len(pods) != 1 || pods[0].Name != m.Status.TargetPod {
			t.Fatalf("pods after the move: %v", kubeworld.PodNames(pods))
		}
		// memhog's check covers its journal: every record it wrote, before
		// and after the move, in the one file.
		p, _, err := bench.StartProbe(ctx, &w.Lab.Hosts[2], w.bin, []string{pods[0].Status.PodIP + ":" + memhogPort}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		res, err := p.Stop()
		if err != nil || !res.StateOK || res.Answers == 0 {
			t.Fatalf("probe %+v %v: the moved memhog's memory or journal is not whole", res, err)
		}
		st, err := os.Stat(filepath.Join(dir, "journal"))
		if err != nil || st.Size() == 0 {
			t.Fatalf("the journal on the shared volume: %v", err)
		}
		rep := m.Status.Report
		t.Logf("shared volume left in place: downtime %.0f ms, total %.0f ms, journal %d bytes", rep.DowntimeMs, rep.TotalMs, st.Size())
	}
}
