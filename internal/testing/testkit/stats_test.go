package testkit

import (
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	five := []time.Duration{5, 1, 4, 2, 3}
	for _, tc := range []struct {
		ds   []time.Duration
		p    int
		want time.Duration
	}{
		{five, 99, 5}, {five, 50, 3}, {five, 20, 1}, {five, 0, 1}, {five, 100, 5},
		{[]time.Duration{4, 1, 3, 2}, 50, 2},
		{nil, 50, 0},
	} {
		if got := Percentile(tc.ds, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %d) = %v, want %v", tc.ds, tc.p, got, tc.want)
		}
	}
	if five[0] != 5 {
		t.Errorf("Percentile sorted its argument: %v", five)
	}
}
