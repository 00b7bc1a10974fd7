// Package demand learns the demand mix placement's look-ahead protects: which request sizes
// tenants ask for, per SKU and region, from the requests the controller has seen (created
// and refused), as exponentially decayed counts with a half-life of HalfLife. The counts
// live in PostgreSQL (demand_requests) so replicas share them and a restart keeps them; no
// create transaction writes there: each replica counts in memory and adds its counts every
// FlushEvery (and at shutdown), and reads everyone's back every RefreshEvery. An admin can
// pin a SKU's mix, which then wins. Until a SKU has MinRequests of decayed history the
// scheduler's default mix applies (docs/scheduling.md, "Demand mix").
//
// Counts and MixOf are the learner's arithmetic without the database; the placement
// benchmark feeds them its simulated requests, so the policy it measures learns as the
// controller does.
package demand

import (
	"math"
	"sort"
	"time"

	"github.com/gpuaas/gpuaas/internal/sched"
)

const (
	// HalfLife is how fast a request's weight fades: after 6 hours it counts half, after a
	// day a sixteenth. Demand drifts by the hour (training bursts, working days); a half-life
	// of hours follows a shift within an afternoon while a few minutes' burst of one size
	// moves the mix only by its share of the last hours' requests. The look-ahead's horizon
	// is the time in which a fifth of the live allocations leave, hours on a GPU fleet, so
	// the mix it protects should be the demand of about that span.
	HalfLife = 6 * time.Hour
	// MinRequests is "enough history": the decayed requests a SKU (or one of its regions)
	// needs before its learned mix replaces the default. 50 puts each share of a mix of
	// four sizes within about +-7 points (one binomial standard deviation at 0.5 is 7%), finer
	// than what moves the look-ahead's choices, and a fleet selling a few requests an hour
	// reaches it in a working day; one seen request at a time cannot swing it.
	MinRequests = 50.0
	// weightScale is the resolution of a learned mix's weights: shares in ten-thousandths.
	weightScale = 10000
)

// Key is one SKU, region ("" for requests that named none) and GPU count.
type Key struct {
	SKU, Region string
	GPUs        int
}

// Decay is the weight of a count age old under halfLife: 2^(-age/halfLife), 1 for an age
// not above 0, and 0 past 64 half-lives (as the database's demand_decay).
func Decay(age, halfLife time.Duration) float64 {
	if age <= 0 {
		return 1
	}
	x := age.Seconds() / halfLife.Seconds()
	if x > 64 {
		return 0
	}
	return math.Exp2(-x)
}

// Counts is decayed request counts, all as of one moment.
type Counts struct {
	halfLife time.Duration
	asOf     time.Time
	by       map[Key]float64
}

// NewCounts is empty counts fading with halfLife.
func NewCounts(halfLife time.Duration) *Counts {
	return &Counts{halfLife: halfLife, by: map[Key]float64{}}
}

// Add counts n requests of k seen at at (not before the last Add's time: earlier ones are
// counted as of it).
func (c *Counts) Add(k Key, n float64, at time.Time) {
	c.decayTo(at)
	c.by[k] += n
}

// decayTo moves the counts' moment to at, fading them by the time passed.
func (c *Counts) decayTo(at time.Time) {
	if c.asOf.IsZero() {
		c.asOf = at
		return
	}
	if !at.After(c.asOf) {
		return
	}
	f := Decay(at.Sub(c.asOf), c.halfLife)
	for k, v := range c.by {
		c.by[k] = v * f
	}
	c.asOf = at
}

// Snapshot is the counts as of at.
func (c *Counts) Snapshot(at time.Time) map[Key]float64 {
	c.decayTo(at)
	out := make(map[Key]float64, len(c.by))
	for k, v := range c.by {
		out[k] = v
	}
	return out
}

// Scope says which requests a learned mix comes from.
const (
	ScopeRegion = "region" // the request's region's
	ScopeSKU    = "sku"    // the SKU's in every region (its region alone has too few)
)

// MixOf is SKU sku's learned mix for a request in region ("": any) from decayed counts: the
// region's own when it has at least min requests, else the SKU's over every region; entries
// in GPU count order with weights in ten-thousandths of the requests. ok is false (entries
// nil) when neither has enough history; requests is then the SKU's history so far.
func MixOf(counts map[Key]float64, sku, region string, min float64) (entries []sched.MixEntry, requests float64, scope string, ok bool) {
	inRegion, all := map[int]float64{}, map[int]float64{}
	regionTotal, allTotal := 0.0, 0.0
	for k, v := range counts {
		if k.SKU != sku || v <= 0 {
			continue
		}
		all[k.GPUs] += v
		allTotal += v
		if region != "" && k.Region == region {
			inRegion[k.GPUs] += v
			regionTotal += v
		}
	}
	by, total := all, allTotal
	scope = ScopeSKU
	if region != "" && regionTotal >= min {
		by, total, scope = inRegion, regionTotal, ScopeRegion
	}
	if total < min || total <= 0 {
		return nil, allTotal, "", false
	}
	sizes := make([]int, 0, len(by))
	for g := range by {
		sizes = append(sizes, g)
	}
	sort.Ints(sizes)
	for _, g := range sizes {
		if w := int(math.Round(by[g] / total * weightScale)); w > 0 {
			entries = append(entries, sched.MixEntry{GPUs: g, Weight: w})
		}
	}
	return entries, total, scope, true
}
