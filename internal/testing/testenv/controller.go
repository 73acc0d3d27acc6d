package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/subflow-dev/subflow/controllers"
)

// ControllerOptions change what StartController runs. The zero value is the controller as
// main.go sets it up, with the wall clock, no metrics server and a resync of an hour (tests
// make the reconciles they need happen).
type ControllerOptions struct {
	Clock  clock.PassiveClock
	Resync time.Duration
	// Manager adjusts the manager's options before it is created (a metrics address, a
	// webhook server).
	Manager func(*ctrl.Options)
	// Setup registers more on the manager once it exists (webhooks).
	Setup func(manager.Manager) error
}

// StartController runs the SubscriptionFlow controller against cfg in this process until stop
// is called; stop waits for it to end and may be called more than once.
func StartController(cfg *rest.Config, opts ControllerOptions) (stop func(), err error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Resync == 0 {
		opts.Resync = time.Hour
	}
	skipNameValidation := true // tests start a controller of the same name more than once per process
	mopts := ctrl.Options{Scheme: Scheme(), Client: controllers.ClientOptions(), Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, Controller: config.Controller{SkipNameValidation: &skipNameValidation}}
	if opts.Manager != nil {
		opts.Manager(&mopts)
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		return nil, err
	}
	r := &controllers.SubscriptionFlowReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Clock: opts.Clock,
		Agents: controllers.NewHTTPAgentClient(2*time.Second, nil), Recorder: mgr.GetEventRecorder("subflow-controller"),
		Resync: opts.Resync}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if opts.Setup != nil {
		if err := opts.Setup(mgr); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "controller stopped:", err) // the test may be over: no t here
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, nil
}
