package controllers

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Maintenance-window schedules are wall-clock times in the window's time zone (docs/design.md section 3):
//   - a start that does not exist (spring forward) opens at the end of the gap;
//   - a start that exists twice (fall back) opens once, at its first occurrence;
//   - duration is elapsed time.
//
// The cron library's own Next skips starts inside a gap and fires repeated ones twice, and it
// returns the zero time for a schedule that never fires (which made an unbounded loop hang a
// worker). So the library only parses; the search below walks calendar dates itself, and every
// walk has a bound.

// cronParser accepts what the CRD admits: five fields or a descriptor such as @daily.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

const (
	// searchDays bounds a search for the next start: a schedule that fires at all fires within
	// eight years (29 February skips at most one leap year, as in 2100).
	searchDays = 8*366 + 1
	// maxChainedStarts bounds the merging of overlapping occurrences when computing when a
	// window ends; past it the computed end is only a point at which the controller evaluates
	// again.
	maxChainedStarts = 16
	// dstSlack is wider than any zone transition's offset change (at most 2h).
	dstSlack = 3 * time.Hour
)

// errNeverFires is returned for a schedule with no occurrence, such as 30 February.
var errNeverFires = errors.New("has no occurrence (no listed month has that day)")

// windowSchedule is one maintenance window, parsed.
type windowSchedule struct {
	spec *cron.SpecSchedule
	// days is spec in UTC, where no clock is moved: its Next answers the library's own day
	// rule (day-of-month and day-of-week ORed when both are restricted) for dayMatches.
	days     *cron.SpecSchedule
	loc      *time.Location
	duration time.Duration
}

func parseWindow(w subflowv1.MaintenanceWindow) (windowSchedule, error) {
	loc, err := location(w.TimeZone)
	if err != nil {
		return windowSchedule{}, fmt.Errorf("timeZone %q: %w", w.TimeZone, err)
	}
	parsed, err := cronParser.Parse(w.Schedule)
	if err != nil {
		return windowSchedule{}, fmt.Errorf("schedule %q: %w", w.Schedule, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return windowSchedule{}, fmt.Errorf("schedule %q: not a calendar schedule", w.Schedule)
	}
	if w.Duration.Duration <= 0 || w.Duration.Duration > subflowv1.MaxWindowDuration {
		return windowSchedule{}, fmt.Errorf("duration %s: must be above zero and at most %s", w.Duration.Duration, subflowv1.MaxWindowDuration)
	}
	days := *spec
	days.Location = time.UTC
	s := windowSchedule{spec: spec, days: &days, loc: loc, duration: w.Duration.Duration}
	if !s.firesAtAll() {
		return windowSchedule{}, fmt.Errorf("schedule %q %w", w.Schedule, errNeverFires)
	}
	return s, nil
}

// locations caches loaded time zones: loading one reads and parses its tzdata.
var locations sync.Map // name -> *time.Location

func location(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if loc, ok := locations.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	locations.Store(name, loc)
	return loc, nil
}

// activeAt reports whether the window is open at now and, if so, when it closes (the end of
// the run of overlapping occurrences, or a re-evaluation point after maxChainedStarts).
func (s windowSchedule) activeAt(now time.Time) (bool, time.Time) {
	start, ok := s.latestStart(now, now.Add(-s.duration))
	if !ok || !now.Before(start.Add(s.duration)) {
		return false, time.Time{}
	}
	// Starts before the end keep it open: jump to the latest start up to the end, each step
	// extending the window by up to a whole duration.
	end := start.Add(s.duration)
	for range maxChainedStarts {
		last, ok := s.latestStart(end, start)
		if !ok {
			break
		}
		start, end = last, last.Add(s.duration)
	}
	return true, end
}

// latestStart returns the latest start in (notBefore, at], walking dates backwards.
func (s windowSchedule) latestStart(at, notBefore time.Time) (time.Time, bool) {
	// A wall time w starts at w - offset(w): only walls up to at's wall under the largest
	// nearby offset can start by at.
	last, first := wallUnder(at, s.loc, largest), wallUnder(notBefore, s.loc, smallest)
	lastDay, firstDay := civilDate(last), civilDate(first)
	fromMinute := last.Hour()*60 + last.Minute()
	for day := lastDay; !day.Before(firstDay); day, fromMinute = day.AddDate(0, 0, -1), 24*60-1 {
		if !s.dayMatches(day) {
			continue
		}
		for h := fromMinute / 60; h >= 0; h-- {
			if s.spec.Hour&(1<<uint(h)) == 0 {
				continue
			}
			m0 := 59
			if h == fromMinute/60 {
				m0 = fromMinute % 60
			}
			for m := m0; m >= 0; m-- {
				if s.spec.Minute&(1<<uint(m)) == 0 {
					continue
				}
				t := wallInstant(day, h, m, s.loc)
				if t.After(at) {
					continue
				}
				if !t.After(notBefore) {
					return time.Time{}, false
				}
				return t, true
			}
		}
	}
	return time.Time{}, false
}

// nextStart returns the earliest start strictly after t within searchDays.
func (s windowSchedule) nextStart(t time.Time) (time.Time, bool) {
	from := wallUnder(t, s.loc, smallest)
	day := civilDate(from)
	fromMinute := from.Hour()*60 + from.Minute()
	for range searchDays {
		if s.dayMatches(day) {
			for h := fromMinute / 60; h < 24; h++ {
				if s.spec.Hour&(1<<uint(h)) == 0 {
					continue
				}
				m0 := 0
				if h == fromMinute/60 {
					m0 = fromMinute % 60
				}
				for m := m0; m < 60; m++ {
					if s.spec.Minute&(1<<uint(m)) == 0 {
						continue
					}
					if start := wallInstant(day, h, m, s.loc); start.After(t) {
						return start, true
					}
				}
			}
		}
		day, fromMinute = day.AddDate(0, 0, 1), 0
	}
	return time.Time{}, false
}

// wallUnder is t's wall clock in loc (as a UTC time) under the smallest or largest offset in
// force within dstSlack of t: wall-clock searches start or end there so that no start near a
// transition is missed, and away from transitions it is simply t's wall clock.
func wallUnder(t time.Time, loc *time.Location, pick func(x, y int) int) time.Time {
	_, offset := t.In(loc).Zone()
	for _, near := range []time.Time{t.Add(-dstSlack), t.Add(dstSlack)} {
		_, o := near.In(loc).Zone()
		offset = pick(offset, o)
	}
	return t.UTC().Add(time.Duration(offset) * time.Second)
}

func smallest(x, y int) int { return min(x, y) }
func largest(x, y int) int  { return max(x, y) }

// dayMatches reports whether the schedule fires on day (a civil date at midnight UTC), by the
// cron library's own day rule: its next firing from the day's start falls on that day (every
// day that matches has one, as the hour and minute fields are never empty).
func (s windowSchedule) dayMatches(day time.Time) bool {
	next := s.days.Next(day.Add(-time.Second))
	return !next.IsZero() && civilDate(next).Equal(day)
}

// civilDate is the calendar date of t as midnight UTC, so that AddDate walks whole days.
func civilDate(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// wallInstant is the instant the wall clock h:m on day shows in loc: the first of two when the
// time repeats, the end of the gap when it does not exist.
func wallInstant(day time.Time, h, m int, loc *time.Location) time.Time {
	wall := time.Date(day.Year(), day.Month(), day.Day(), h, m, 0, 0, time.UTC)
	var first time.Time
	for _, probe := range []time.Time{wall.Add(-26 * time.Hour), wall, wall.Add(26 * time.Hour)} {
		_, offset := probe.In(loc).Zone()
		candidate := wall.Add(-time.Duration(offset) * time.Second)
		if _, actual := candidate.In(loc).Zone(); actual != offset {
			continue // with this offset the wall time falls on the other side of a transition
		}
		if first.IsZero() || candidate.Before(first) {
			first = candidate
		}
	}
	if !first.IsZero() {
		return first
	}
	// In a gap: the wall time read with the earlier offset lies after the transition, whose
	// instant is the start of the zone period it falls in.
	_, before := wall.Add(-26 * time.Hour).In(loc).Zone()
	gapEnd, _ := wall.Add(-time.Duration(before) * time.Second).In(loc).ZoneBounds()
	return gapEnd
}

// firesAtAll reports whether the schedule has any day at all. The library searches five years
// ahead; from 2024 on that spans every month, every weekday and a 29 February.
func (s windowSchedule) firesAtAll() bool {
	return !s.days.Next(time.Date(2024, time.January, 1, 0, 0, 0, 0, time.UTC).Add(-time.Second)).IsZero()
}
