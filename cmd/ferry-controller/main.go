// Command ferry-controller reconciles ferry.dev Migrations in a
// Kubernetes cluster (internal/kubecontroller): each moves one pod's
// container to another node through the nodes' ferry agents, which it
// reaches with an operator's certificate (ferry certs operator); and
// FollowPolicies, each a pod moved by Migrations after its clients.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	agentclient "github.com/ferry-migrate/ferry/api/client"
	v1 "github.com/ferry-migrate/ferry/api/kube/v1alpha1"
	"github.com/ferry-migrate/ferry/internal/kubecontroller"
)

var version = "dev"

func main() {
	var (
		tlsDir, operator, metrics, probes string
		port                              int
		showVersion, leaderElect          bool
	)
	flag.StringVar(&tlsDir, "tls-dir", "/etc/ferry/tls", "directory of the operator's certificate (NAME.crt, NAME.key) and the agents' CA (ca.crt)")
	flag.StringVar(&operator, "operator", "ferry-controller", "the operator certificate's name in --tls-dir (ferry certs operator NAME)")
	flag.IntVar(&port, "agent-port", 7070, "the port nodes' ferry agents listen on at the node's InternalIP (a node's "+kubecontroller.AnnotationAgent+" annotation overrides it)")
	flag.StringVar(&metrics, "metrics-bind-address", "0", "where to serve the controller's Prometheus metrics (0: nowhere)")
	flag.StringVar(&probes, "health-probe-bind-address", "0", "where to serve /healthz and /readyz (0: nowhere)")
	flag.BoolVar(&leaderElect, "leader-elect", false, "run one active controller among replicas (a Lease in the controller's namespace)")
	flag.BoolVar(&showVersion, "version", false, "print the version and exit")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: ferry-controller [flags]\n\nReconciles ferry.dev/v1alpha1 Migrations and FollowPolicies (see docs/KUBERNETES.md). The cluster is\nthe one --kubeconfig, $KUBECONFIG or the pod's service account names.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if showVersion {
		fmt.Println(version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if err := run(tlsDir, operator, port, metrics, probes, leaderElect); err != nil {
		fmt.Fprintln(os.Stderr, "ferry-controller:", err)
		os.Exit(1)
	}
}

func run(tlsDir, operator string, port int, metrics, probes string, leaderElect bool) error {
	sec, err := agentclient.LoadOperator(tlsDir, operator)
	if err != nil {
		return fmt.Errorf("the operator's certificate (ferry certs operator %s --help): %w", operator, err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metrics},
		HealthProbeBindAddress: probes,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "ferry-controller.ferry.dev",
		// The process exits once the manager stops: a replacement need not
		// wait out the lease.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return err
	}
	// Alive and ready once serving: a replica waiting for the lease is
	// ready too, so that a rollout goes on.
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	r := &kubecontroller.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ferry-controller"),
		Agents: kubecontroller.Agents{Port: port, Operator: sec}}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	fr := &kubecontroller.FollowReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ferry-controller"), Agents: r.Agents}
	if err := fr.SetupWithManager(mgr); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
