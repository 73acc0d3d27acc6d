// Command chaos runs a seeded random run of operations over the whole system (see package
// internal/testing/chaos) and exits non-zero on any invariant violation. The seed is printed first;
// run again with -seed to replay the same sequence of operations.
//
//	go run ./hack/chaos -seed 42 -ops 1000 -messages 100000 -duration 10m
//
// It runs on the in-process test cluster, or with -pulsar-url and -admin-url on a real broker
// (in a namespace new to the run), e.g. the one hack/pulsar/pulsar.sh starts:
//
//	hack/pulsar/pulsar.sh exec -- sh -c 'go run ./hack/chaos -pulsar-url "$PULSAR_URL" -admin-url "$PULSAR_ADMIN_URL"'
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/chaos"
)

func main() {
	cfg := chaos.Config{Out: os.Stdout}
	flag.Uint64Var(&cfg.Seed, "seed", uint64(time.Now().UnixNano()), "seed of every random choice (default: time-based, printed)")
	flag.IntVar(&cfg.Ops, "ops", 1000, "operations to apply")
	flag.IntVar(&cfg.Messages, "messages", 100000, "numbered messages to produce")
	flag.IntVar(&cfg.Pods, "pods", 10, "pods at the start and the end")
	flag.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "length of the operations phase")
	flag.DurationVar(&cfg.Converge, "converge", 90*time.Second, "bound on convergence after the last operation")
	flag.DurationVar(&cfg.Drain, "drain", 2*time.Minute, "bound on delivering every message after the final Running")
	flag.StringVar(&cfg.ServiceURL, "pulsar-url", "", "run on this Pulsar broker (pulsar://host:6650) instead of the in-process test cluster; needs -admin-url")
	flag.StringVar(&cfg.AdminURL, "admin-url", "", "the broker's admin API (http://host:8080), with -pulsar-url")
	verbose := flag.Bool("v", false, "print every operation as it is applied")
	flag.Parse()
	if (cfg.ServiceURL == "") != (cfg.AdminURL == "") {
		fmt.Fprintln(os.Stderr, "chaos: -pulsar-url and -admin-url go together")
		os.Exit(2)
	}
	if *verbose {
		cfg.Verbose = os.Stdout
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos (seed %d): %v\n", cfg.Seed, err)
		os.Exit(2)
	}
	if rep.Failed() {
		os.Exit(1)
	}
}
