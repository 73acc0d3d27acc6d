package chaos

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/testclock"
)

// replica is one controller manager process.
type replica struct {
	id     int
	mgr    ctrl.Manager
	cancel context.CancelFunc
	done   chan struct{}
}

// elected reports whether this replica leads (always, without leader election).
func (r *replica) elected() bool {
	select {
	case <-r.mgr.Elected():
		return true
	default:
		return false
	}
}

// kill stops the manager as a crash would: the lease is not released.
func (r *replica) kill() {
	r.cancel()
	<-r.done
}

type controllerSet struct {
	cfg    *rest.Config
	scheme *runtime.Scheme
	clock  *testclock.Shifted
	nextID int
	live   []*replica
}

const leaseNamespace = "chaos-system"

// start runs a new manager with the real reconciler; with leaderElection it competes for the
// lease with the other replicas.
func (cs *controllerSet) start(leaderElection bool) (*replica, error) {
	skip := true
	lease, renew, retry := 3*time.Second, 2*time.Second, 500*time.Millisecond
	mgr, err := ctrl.NewManager(cs.cfg, ctrl.Options{Scheme: cs.scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Client: controllers.ClientOptions(), Cache: controllers.CacheOptions(), Controller: config.Controller{SkipNameValidation: &skip},
		LeaderElection: leaderElection, LeaderElectionID: "subflow-chaos", LeaderElectionNamespace: leaseNamespace,
		LeaseDuration: &lease, RenewDeadline: &renew, RetryPeriod: &retry})
	if err != nil {
		return nil, err
	}
	r := &controllers.SubscriptionFlowReconciler{Client: mgr.GetClient(), Scheme: cs.scheme, Clock: cs.clock,
		Agents: controllers.NewHTTPAgentClient(2*time.Second, nil), Recorder: mgr.GetEventRecorder("subflow-controller")}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	cs.nextID++
	rep := &replica{id: cs.nextID, mgr: mgr, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	rep.cancel = cancel
	go func() { defer close(rep.done); _ = mgr.Start(ctx) }()
	cs.live = append(cs.live, rep)
	return rep, nil
}

// killLeader kills the replica that leads (the first, if none has been elected yet).
func (cs *controllerSet) killLeader() int {
	if len(cs.live) == 0 {
		return 0
	}
	victim := 0
	for i, r := range cs.live {
		if r.elected() {
			victim = i
			break
		}
	}
	r := cs.live[victim]
	cs.live = append(cs.live[:victim], cs.live[victim+1:]...)
	r.kill()
	return r.id
}

func (cs *controllerSet) killAll() {
	for _, r := range cs.live {
		r.kill()
	}
	cs.live = nil
}
