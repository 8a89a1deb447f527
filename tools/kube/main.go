// Command ferry-kube holds the Kubernetes components ferry's lab runs, in
// one binary as hyperkube once did: the first argument names the component
// and the rest are its own flags, e.g.
//
//	ferry-kube apiserver --etcd-servers=...
//	ferry-kube kubelet --version
//
// One binary links the shared Kubernetes packages once: it builds faster
// and takes less disk than four. It also packs static binaries as OCI
// image-layout archives (ferry-kube image), which is how the lab makes the
// pause image and test images without a registry.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver and kube-controller-manager embed them

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"github.com/ferry-migrate/ferry/tools/kube/ociimage"
)

// components maps each name ferry-kube answers to (the short one and the
// upstream binary's) to the command it runs.
var components = map[string]func() *cobra.Command{
	"apiserver":               apiserver.NewAPIServerCommand,
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"controller-manager":      controllermanager.NewControllerManagerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"scheduler":               func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	// Called through a link named after a component (kubelet -> ferry-kube),
	// the link's name says which; otherwise the first argument does.
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if _, ok := components[name]; !ok && name != "image" {
		if len(args) == 0 {
			usage()
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	if name == "image" {
		if err := ociimage.Main(args); err != nil {
			fmt.Fprintln(os.Stderr, "ferry-kube image:", err)
			os.Exit(1)
		}
		return
	}
	newCommand, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "ferry-kube: unknown component %q\n", name)
		usage()
		os.Exit(2)
	}
	cmd := newCommand()
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}

func usage() {
	var names []string
	for n := range components {
		if !strings.HasPrefix(n, "kube-") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: ferry-kube {%s|image} [flags]\n", strings.Join(names, "|"))
}
