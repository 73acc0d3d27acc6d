// Command demo walks through subflow end to end on an embedded default: a local control plane,
// the test Pulsar broker (or any broker: --pulsar-url and --admin-url), three consumer pods with agents, a producer and the controller. It
// pauses, seeks, runs a maintenance window and resumes, checking each step, and exits non-zero
// if any step did not hold. With --interactive it keeps everything running for kubectl.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	interactive := flag.Bool("interactive", false, "keep running after the walk-through and print a kubeconfig for kubectl")
	var broker brokerURLs
	flag.StringVar(&broker.service, "pulsar-url", "", "run on this Pulsar broker (pulsar://host:6650) instead of the test broker; needs --admin-url")
	flag.StringVar(&broker.admin, "admin-url", "", "the broker's admin API (http://host:8080), with --pulsar-url")
	flag.Parse()
	if (broker.service == "") != (broker.admin == "") {
		fmt.Fprintln(os.Stderr, "demo: --pulsar-url and --admin-url go together")
		os.Exit(2)
	}
	stopWithParent()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, *interactive, broker); err != nil {
		fmt.Fprintln(os.Stderr, "\nDEMO FAILED:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, interactive bool, broker brokerURLs) error {
	started := time.Now()
	w, err := startWorld(ctx, 3, broker)
	if w != nil {
		defer w.close()
	}
	if err != nil {
		return err
	}
	d := &demo{w: w}
	for _, s := range []struct {
		title string
		run   func(context.Context) error
	}{
		{"create the SubscriptionFlow (state Running)", d.createFlow},
		{"kubectl patch sf orders-ingest --type merge -p '{\"spec\":{\"state\":\"Paused\"}}'", d.pause},
		{"seek the paused subscription to a broker-entry index", d.seek},
		{"maintenance window: Running in spec, paused Saturdays 03:00-04:00 UTC", d.window},
		{"the window ends: the flow runs again and the backlog drains", d.resume},
		{"spec.pauseWhen: the orders database goes down and the flow pauses itself", d.dependencyFails},
		{"the database recovers: the flow resumes after resumeAfter and the backlog drains", d.dependencyRecovers},
		{"everything produced is delivered", d.drained},
	} {
		step(s.title)
		if err := s.run(ctx); err != nil {
			d.table(ctx)
			return err
		}
	}
	fmt.Printf("\nALL STEPS HELD in %s: pause stopped delivery and permits, seek moved the cursor, the window paused and released, the flow paused itself while its database was down, resume delivered every message.\n",
		time.Since(started).Round(time.Second))
	if interactive {
		return d.interactive(ctx)
	}
	return nil
}

func step(title string) { fmt.Printf("\n== %s\n", title) }

// interactive keeps the world running for kubectl until interrupted.
func (d *demo) interactive(ctx context.Context) error {
	path, err := d.w.writeKubeconfig()
	if err != nil {
		return err
	}
	// The walk-through moved the controller's clock days ahead to show a window; a person now
	// types `kubectl subflow pause --for 30m`, which must count from the wall clock.
	d.w.clock.Set(time.Now())
	if err := d.patch(ctx, fmt.Sprintf(`{"metadata":{"annotations":{"demo.subflow.dev/clock":"%d"}}}`, time.Now().UnixNano())); err != nil {
		return err
	}
	fmt.Println("\n   demo clock -> the wall clock again")
	fmt.Printf(`
Everything keeps running. In another terminal:
  export KUBECONFIG=%s
  kubectl get sf -n %s
  kubectl patch sf orders-ingest -n %s --type merge -p '{"spec":{"state":"Paused"}}'
  kubectl patch sf orders-ingest -n %s --type merge -p '{"spec":{"state":"Running"}}'
  kubectl annotate sf orders-ingest -n %s subflow.dev/override-state=Stopped
  kubectl get sf orders-ingest -n %s -o yaml
  curl -s http://%s/metrics | grep ^subflow_
Press Ctrl-C to stop.
`, path, namespace, namespace, namespace, namespace, namespace, d.w.metricsAddr)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		case <-tick.C:
			d.table(ctx)
		}
	}
}
