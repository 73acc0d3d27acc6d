// Command subflow runs the SubscriptionFlow controller.
package main

import (
	"flag"
	"log/slog"
	"os"
	"time"
	_ "time/tzdata" // maintenance windows name IANA time zones; distroless images carry none

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/controllers/pausewhen"
	"github.com/subflow-dev/subflow/webhooks"
)

func main() {
	var metricsAddr, probeAddr, pprofAddr, agentCAFile, agentServerName string
	var leaderElect, metricsSecure bool
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to callers the API server authenticates and "+
		"authorizes (get on the /metrics non-resource URL); false serves plain HTTP to anyone who reaches the port.")
	flag.StringVar(&agentCAFile, "agent-ca-file", "", "PEM CA bundle that signs the certificates of agents served over https "+
		"(container port named subflow-https); empty means the system roots.")
	flag.StringVar(&agentServerName, "agent-tls-server-name", "", "Name expected in agents' certificates; empty means the pod IP.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the health and readiness probes bind to.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "0", "Address net/http/pprof binds to, for profiling; 0 (default) disables it.")
	var resync, pushTimeout, backlogLead, rotationGrace time.Duration
	var parallelism, workers, statusWrites, refreshBudget int
	flag.DurationVar(&resync, "resync", controllers.DefaultResync, "Period of the fallback push to every agent.")
	flag.DurationVar(&pushTimeout, "push-timeout", controllers.DefaultPushTimeout, "Timeout of one push to one agent.")
	flag.IntVar(&parallelism, "push-parallelism", controllers.DefaultParallelism, "Concurrent pushes per flow.")
	flag.IntVar(&workers, "max-concurrent-reconciles", controllers.DefaultMaxConcurrentReconciles, "Flows reconciled at once.")
	flag.IntVar(&statusWrites, "max-concurrent-status-writes", controllers.DefaultMaxConcurrentStatusWrites,
		"Status writes in flight; below the workers, so that pushes come before reports when many flows change at once.")
	flag.IntVar(&refreshBudget, "refresh-pushes-per-second", controllers.DefaultRefreshPushesPerSecond,
		"Pushes a second that the refresh of halted flows (and of flows whose agents showed no consumer) may cost, all flows "+
			"together: their refresh periods (10 s at least) grow to share it.")
	var prometheusURL string
	flag.StringVar(&prometheusURL, "prometheus-url", "", "Prometheus whose HTTP API runs the PromQL of spec.pauseWhen conditions, "+
		"e.g. http://prometheus-operated.monitoring:9090; empty: such conditions read as errors (their onError decides).")
	flag.DurationVar(&backlogLead, "backlog-warning-lead-time", controllers.DefaultBacklogLeadTime,
		"How long before the broker's retention would delete a halted flow's waiting messages BacklogAtRisk turns True.")
	flag.DurationVar(&rotationGrace, "token-rotation-grace", controllers.DefaultTokenRotationGrace,
		"How long after an agent-token Secret changes the previous token is still offered to agents that refuse the new one "+
			"(their kubelet has not updated the mounted copy yet).")
	// In a cluster two replicas without election would both push and write status; outside
	// one (make run) there is no namespace for the lease unless one is given.
	inCluster := os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	flag.BoolVar(&leaderElect, "leader-elect", inCluster, "Elect a leader so that only one replica reconciles at a time "+
		"(default true when running in a cluster).")
	var leaseNamespace string
	flag.StringVar(&leaseNamespace, "leader-election-namespace", "", "Namespace of the leader election lease; empty means the "+
		"controller's own, which only a controller running in a cluster knows (set it to elect outside one, e.g. make run).")
	var enableWebhooks bool
	var webhookPort int
	var webhookService string
	webhookOpts := webhooks.Options{Namespace: os.Getenv("POD_NAMESPACE")}
	// Outside a cluster (make run) the API server cannot reach the webhook server.
	flag.BoolVar(&enableWebhooks, "enable-webhooks", inCluster, "Serve the pod injection and SubscriptionFlow validation webhooks "+
		"(default true when running in a cluster).")
	flag.IntVar(&webhookPort, "webhook-port", webhook.DefaultPort, "Port the webhook server listens on.")
	flag.StringVar(&webhookOpts.SidecarImage, "sidecar-image", "", "Image of the subflow sidecar that pods labelled "+
		"subflow.dev/inject=sidecar get; empty leaves them unwired with the reason recorded.")
	webhookOpts.SidecarResources = webhooks.DefaultSidecarResources()
	flag.Func("sidecar-requests", "The sidecar's resource requests, e.g. cpu=10m,memory=32Mi (default cpu=10m,memory=32Mi).", func(v string) error {
		list, err := webhooks.ParseResourceList(v)
		webhookOpts.SidecarResources.Requests = list
		return err
	})
	flag.Func("sidecar-limits", "The sidecar's resource limits, e.g. memory=128Mi (default memory=128Mi; an empty value sets none).", func(v string) error {
		list, err := webhooks.ParseResourceList(v)
		webhookOpts.SidecarResources.Limits = list
		return err
	})
	flag.StringVar(&webhookOpts.Certs, "webhook-certs", webhooks.CertsSelfManaged, "Where the webhook serving certificate comes from: "+
		webhooks.CertsSelfManaged+" (a CA and certificate the controller keeps in --webhook-cert-secret, renews and writes into the webhook "+
		"configurations' caBundle) or "+webhooks.CertsFromFiles+" (tls.crt and tls.key in --webhook-cert-dir, e.g. from cert-manager).")
	flag.StringVar(&webhookOpts.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory of the webhook serving certificate.")
	flag.StringVar(&webhookOpts.SecretName, "webhook-cert-secret", "subflow-webhook-server-cert", "Secret, in the controller's "+
		"namespace ($POD_NAMESPACE), that holds the self-managed CA and serving certificate.")
	flag.StringVar(&webhookService, "webhook-service", "subflow-webhook-service", "Service in front of the webhook server "+
		"(the self-managed certificate is issued for <service>.<namespace>.svc).")
	flag.StringVar(&webhookOpts.MutatingConfiguration, "mutating-webhook-configuration", "subflow-mutating-webhook-configuration",
		"MutatingWebhookConfiguration whose caBundle the self-managed CA is written into.")
	flag.StringVar(&webhookOpts.ValidatingConfiguration, "validating-webhook-configuration", "subflow-validating-webhook-configuration",
		"ValidatingWebhookConfiguration whose caBundle the self-managed CA is written into.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	setupLog := ctrl.Log.WithName("setup")
	for name, n := range map[string]int{"push-parallelism": parallelism, "max-concurrent-reconciles": workers, "max-concurrent-status-writes": statusWrites,
		"refresh-pushes-per-second": refreshBudget} {
		if n < 1 {
			setupLog.Error(nil, "The flag must be at least 1", "flag", "--"+name, "value", n)
			os.Exit(2)
		}
	}
	// Between collections the heap grows to twice what is live (GOGC=100), which for a large
	// fleet nears the container's memory limit. A soft limit at 90% of it makes the collector
	// work harder near the limit instead of the container being killed (docs/design.md 4.16).
	// Without a cgroup limit, or with GOMEMLIMIT set, nothing changes.
	_, _ = memlimit.Set(memlimit.WithRatio(0.9), memlimit.WithProvider(memlimit.FromCgroup),
		memlimit.WithLogger(slog.New(logr.ToSlogHandler(setupLog))))

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(subflowv1.AddToScheme(scheme))

	metricsOpts := metricsserver.Options{BindAddress: metricsAddr, SecureServing: metricsSecure}
	if metricsSecure {
		// As kubebuilder scaffolds it: TokenReview and SubjectAccessReview through the API server.
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	agentTLS, err := controllers.AgentTLSConfig(agentCAFile, agentServerName)
	if err != nil {
		setupLog.Error(err, "Unable to read the agents' CA bundle", "file", agentCAFile)
		os.Exit(1)
	}
	var hooks *webhooks.Webhooks
	var webhookServer webhook.Server
	if enableWebhooks {
		webhookOpts.DNSName = webhookService + "." + webhookOpts.Namespace + ".svc"
		webhookOpts.RequireLeaderElection = leaderElect
		if hooks, err = webhooks.New(webhookOpts); err != nil {
			setupLog.Error(err, "Unable to configure the webhooks")
			os.Exit(1)
		}
		webhookServer = webhook.NewServer(hooks.ServerOptions(webhook.Options{Port: webhookPort}))
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), withElection(ctrl.Options{
		WebhookServer:          webhookServer,
		Scheme:                 scheme,
		Metrics:                metricsOpts,
		HealthProbeBindAddress: probeAddr,
		PprofBindAddress:       pprofAddr,
		// Token Secrets are read one by one: caching would need list/watch on every Secret.
		Client: controllers.ClientOptions(),
		Cache:  controllers.CacheOptions(),
	}, leaderElect, leaseNamespace))
	if err != nil {
		setupLog.Error(err, "Unable to create manager")
		os.Exit(1)
	}
	conditions := &controllers.Conditions{}
	if prometheusURL != "" {
		if conditions.Prometheus, err = pausewhen.NewPrometheus(prometheusURL); err != nil {
			setupLog.Error(err, "The flag cannot be used", "flag", "--prometheus-url")
			os.Exit(2)
		}
	}
	reconciler := &controllers.SubscriptionFlowReconciler{
		Client:                    mgr.GetClient(),
		Scheme:                    mgr.GetScheme(),
		Agents:                    controllers.NewHTTPAgentClient(pushTimeout, agentTLS),
		Clock:                     clock.RealClock{},
		Recorder:                  mgr.GetEventRecorder("subflow-controller"),
		Resync:                    resync,
		Parallelism:               parallelism,
		MaxConcurrentReconciles:   workers,
		MaxConcurrentStatusWrites: statusWrites,
		BacklogLeadTime:           backlogLead,
		TokenRotationGrace:        rotationGrace,
		RefreshPushesPerSecond:    refreshBudget,
		Conditions:                conditions,
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "Unable to set up controller", "controller", "SubscriptionFlow")
		os.Exit(1)
	}
	if hooks != nil {
		if err := hooks.SetupWithManager(mgr); err != nil {
			setupLog.Error(err, "Unable to set up the webhooks")
			os.Exit(1)
		}
		// Ready once the server completes a TLS handshake, i.e. has its certificate.
		utilruntime.Must(mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()))
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))

	setupLog.Info("Starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "Manager stopped with an error")
		os.Exit(1)
	}
}

// withElection sets who reconciles: with elect, one replica at a time, the holder of a lease
// in namespace; an empty namespace is the controller's own, which controller-runtime reads
// from the service account and so knows only in a cluster.
func withElection(opts ctrl.Options, elect bool, namespace string) ctrl.Options {
	opts.LeaderElection = elect
	opts.LeaderElectionID = "subflow-controller.subflow.dev"
	opts.LeaderElectionNamespace = namespace
	return opts
}
