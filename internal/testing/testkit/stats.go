package testkit

import (
	"slices"
	"time"
)

// Percentile is the p-th percentile (0-100) of ds by nearest rank: the p99 of 5 samples is the
// largest. ds is not changed; 0 when it is empty.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	rank := (len(sorted)*p + 99) / 100
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Millis is d in milliseconds, for b.ReportMetric.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
