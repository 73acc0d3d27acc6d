package testclock

import (
	"testing"
	"time"
)

func TestShiftedRunsFromWhereItWasMoved(t *testing.T) {
	target := time.Date(2027, time.March, 28, 0, 59, 0, 0, time.UTC)
	c := ShiftedFrom(target)
	if d := c.Now().Sub(target); d < 0 || d > time.Minute {
		t.Fatalf("ShiftedFrom: reads %s, want about %s", c.Now(), target)
	}
	c.Advance(2 * time.Hour)
	if d := c.Now().Sub(target.Add(2 * time.Hour)); d < 0 || d > time.Minute {
		t.Fatalf("Advance: reads %s", c.Now())
	}
	c.Set(target)
	if d := c.Now().Sub(target); d < 0 || d > time.Minute {
		t.Fatalf("Set: reads %s", c.Now())
	}
}
