package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/drain"
	"github.com/ferry-migrate/ferry/internal/kubedrain"
)

// kubeDrainFlags are ferry drain's flags for a Kubernetes node.
type kubeDrainFlags struct {
	node, kubeconfig, target string
	noEvict                  bool
	timeout                  time.Duration
}

func (k *kubeDrainFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&k.node, "kubernetes", "", "drain this Kubernetes node by Migrations (see above) instead of a host's containers")
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "with --kubernetes: the cluster's kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&k.target, "target-node", "", "with --kubernetes: every pod's target node (default: weighed per pod by the controller)")
	f.BoolVar(&k.noEvict, "no-evict", false, "with --kubernetes: leave the pods that cannot move running instead of evicting them")
	f.DurationVar(&k.timeout, "migration-timeout", 10*time.Minute, "with --kubernetes: give up following one Migration after this long (it goes on; the pod is not evicted)")
}

// check refuses what a Kubernetes drain does not take, before anything
// is cordoned.
func (k *kubeDrainFlags) check(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return cli.UsageError{Err: fmt.Errorf("--kubernetes drains every pod of the node; it takes no container names (got %s)", strings.Join(args, " "))}
	}
	var hostOnly []string
	for _, name := range []string{"to", "from", "tls-dir", "operator", "handoff", "runtime", "max-rounds", "min-round-bytes", "auto-converge", "compress", "precopy-engine", "write-tracking", "switchover"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			hostOnly = append(hostOnly, "--"+name)
		}
	}
	if len(hostOnly) > 0 {
		return cli.UsageError{Err: fmt.Errorf("%s: for a host's containers only; --kubernetes takes --mode, --max-downtime, --concurrency, --target-node, --no-evict, --kubeconfig", strings.Join(hostOnly, ", "))}
	}
	return nil
}

func (k *kubeDrainFlags) run(cmd *cobra.Command, o drain.Options, asJSON bool) error {
	c, err := kubedrain.Connect(k.kubeconfig)
	if err != nil {
		return err
	}
	ko := kubedrain.Options{Client: c, Node: k.node, Mode: o.Request.Mode, MaxDowntime: o.Request.Precopy.MaxDowntime,
		TargetNode: k.target, Concurrency: o.Concurrency, NoEvict: k.noEvict, MigrationTimeout: k.timeout}
	if !asJSON {
		var mu sync.Mutex
		ko.Started = func(p kubedrain.Pod) {
			mu.Lock()
			defer mu.Unlock()
			if p.Reason != "" {
				fmt.Fprintf(os.Stderr, "evicting %s/%s: %s\n", p.Namespace, p.Name, p.Reason)
				return
			}
			fmt.Fprintf(os.Stderr, "moving %s/%s\n", p.Namespace, p.Name)
		}
		ko.Finished = func(p kubedrain.Pod) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Println(kubePodLine(p))
		}
	}
	res, err := kubedrain.Run(cmd.Context(), ko)
	if err != nil {
		return err
	}
	if asJSON {
		if err := cli.PrintJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Printf("drained node %s in %.0f ms: %s\n", res.Node, res.TotalMs, kubeTally(res))
	}
	if !res.OK {
		return cli.ExitError{Code: 1}
	}
	return nil
}

// kubePodLine says what became of one pod.
func kubePodLine(p kubedrain.Pod) string {
	name := p.Namespace + "/" + p.Name
	switch p.Outcome {
	case kubedrain.Moved:
		line := fmt.Sprintf("%s: moved to %s as %s (Migration %s)", name, p.TargetNode, p.TargetPod, p.Migration)
		if r := p.Report; r != nil {
			line += fmt.Sprintf(", %s, downtime %.0f ms, total %.0f ms", r.Mode, r.DowntimeMs, r.TotalMs)
		}
		return line
	default:
		return fmt.Sprintf("%s: %s: %s", name, p.Outcome, p.Reason)
	}
}

func kubeTally(res kubedrain.Result) string {
	n := map[string]int{}
	for _, p := range res.Pods {
		n[p.Outcome]++
	}
	if len(res.Pods) == 0 {
		return "no pod was there"
	}
	var parts []string
	for _, o := range []string{kubedrain.Moved, kubedrain.Evicted, kubedrain.Skipped, kubedrain.Failed} {
		if n[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[o], o))
		}
	}
	return strings.Join(parts, ", ")
}
