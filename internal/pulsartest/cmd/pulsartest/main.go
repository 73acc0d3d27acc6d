// Command pulsartest runs the in-memory test broker for demos: it prints the
// service and admin URLs and serves until interrupted.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/subflow-dev/subflow/internal/pulsartest"
)

func main() {
	var opts pulsartest.Options
	flag.IntVar(&opts.EntriesPerLedger, "entries-per-ledger", 0, "entries per ledger before rollover (0: default)")
	flag.BoolVar(&opts.DisableIndexMetadata, "disable-index-metadata", false, "model a broker without broker-entry index metadata")
	flag.BoolVar(&opts.DisableIndexLookup, "disable-index-lookup", false, "model a broker without getMessageIdByIndex (before PIP-415)")
	flag.IntVar(&opts.ReadBatchSize, "read-batch-size", 0, "dispatcherMaxReadBatchSize in entries (0: 100)")
	flag.BoolVar(&opts.PreciseDispatcherFlowControl, "precise-dispatcher-flow-control", false, "preciseDispatcherFlowControl")
	flag.IntVar(&opts.MaxUnackedPerConsumer, "max-unacked-per-consumer", 0, "maxUnackedMessagesPerConsumer (0: 50000, negative: unlimited)")
	flag.IntVar(&opts.MaxUnackedPerSubscription, "max-unacked-per-subscription", 0, "maxUnackedMessagesPerSubscription (0: 200000, negative: unlimited)")
	flag.BoolVar(&opts.Deduplication, "deduplication", false, "brokerDeduplicationEnabled")
	flag.DurationVar(&opts.ActiveConsumerFailoverDelay, "failover-delay", 0, "activeConsumerFailoverDelayTimeMillis (0: 1s, negative: none)")
	flag.StringVar(&opts.AdvertisedURL, "advertised-url", "", "service URL that lookups answer (default: the broker's own)")
	flag.Parse()

	b, err := pulsartest.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulsartest:", err)
		os.Exit(1)
	}
	fmt.Printf("PULSAR_SERVICE_URL=%s\nPULSAR_ADMIN_URL=%s\n", b.ServiceURL(), b.AdminURL())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "pulsartest: close:", err)
		os.Exit(1)
	}
}
