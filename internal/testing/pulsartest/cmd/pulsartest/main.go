// Command pulsartest runs the in-memory test broker for demos: it prints the
// service and admin URLs and serves until interrupted.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
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
	flag.StringVar(&opts.AdvertisedURL, "advertised-url", "", "service URL that lookups answer (default: the broker's own; single broker only)")
	flag.DurationVar(&opts.DefaultMessageTTL, "message-ttl", 0, "ttlDurationDefaultInSeconds (0: no TTL)")
	flag.BoolVar(&opts.PreciseTimeBasedBacklogQuotaCheck, "precise-time-backlog-quota", false, "preciseTimeBasedBacklogQuotaCheck")
	flag.DurationVar(&opts.MessageExpiryCheckInterval, "expiry-check-interval", 0, "messageExpiryCheckIntervalInMinutes (0: 5m, negative: never)")
	flag.DurationVar(&opts.BacklogQuotaCheckInterval, "backlog-quota-check-interval", 0, "backlogQuotaCheckIntervalInSeconds (0: 60s, negative: never)")
	brokers := flag.Int("brokers", 1, "brokers in the cluster; broker 0 is the leader and its URLs are printed first")
	flag.Parse()

	closer, err := start(*brokers, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulsartest:", err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	if err := closer(); err != nil {
		fmt.Fprintln(os.Stderr, "pulsartest: close:", err)
		os.Exit(1)
	}
}

// start runs one broker, or a cluster whose leader's URLs are printed as
// the unnumbered ones and every broker's with its index.
func start(brokers int, opts pulsartest.Options) (func() error, error) {
	if brokers <= 1 {
		b, err := pulsartest.New(opts)
		if err != nil {
			return nil, err
		}
		fmt.Printf("PULSAR_SERVICE_URL=%s\nPULSAR_ADMIN_URL=%s\n", b.ServiceURL(), b.AdminURL())
		return b.Close, nil
	}
	c, err := pulsartest.NewCluster(brokers, opts)
	if err != nil {
		return nil, err
	}
	fmt.Printf("PULSAR_SERVICE_URL=%s\nPULSAR_ADMIN_URL=%s\n", c.Broker(0).ServiceURL(), c.Broker(0).AdminURL())
	for i, b := range c.Brokers() {
		fmt.Printf("PULSAR_SERVICE_URL_%d=%s\nPULSAR_ADMIN_URL_%d=%s\n", i, b.ServiceURL(), i, b.AdminURL())
	}
	return c.Close, nil
}
