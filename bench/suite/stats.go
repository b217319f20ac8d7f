package suite

import (
	"math"
	"slices"
	"time"
)

// Dist summarises a sample of durations, in microseconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	Max  float64 `json:"max_us"`
}

func summarize(d []time.Duration) Dist {
	if len(d) == 0 {
		return Dist{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	us := func(v time.Duration) float64 { return float64(v) / 1e3 }
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return us(s[max(0, min(i, len(s)-1))])
	}
	return Dist{N: len(s), Mean: us(sum) / float64(len(s)), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: us(s[len(s)-1])}
}

// Spread describes per-goroutine acquisition counts.
type Spread struct {
	Min    int     `json:"min"`
	Median float64 `json:"median"`
	Max    int     `json:"max"`
	MinMax float64 `json:"min_over_max"`
	Jain   float64 `json:"jain"` // (sum x)^2 / (n sum x^2): 1 = perfectly even
}

func spread(counts []int) Spread {
	if len(counts) == 0 {
		return Spread{}
	}
	s := slices.Clone(counts)
	slices.Sort(s)
	var sum, sq float64
	for _, c := range s {
		sum += float64(c)
		sq += float64(c) * float64(c)
	}
	med := float64(s[len(s)/2])
	if len(s)%2 == 0 {
		med = float64(s[len(s)/2-1]+s[len(s)/2]) / 2
	}
	out := Spread{Min: s[0], Median: med, Max: s[len(s)-1]}
	if out.Max > 0 {
		out.MinMax = float64(out.Min) / float64(out.Max)
	}
	if sq > 0 {
		out.Jain = sum * sum / (float64(len(s)) * sq)
	}
	return out
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// pairedRatio is the median over rounds of a[i]/b[i]: each round's
// contenders ran next to each other, so a drift in the machine's speed
// (other work on it) cancels out of each ratio.
func pairedRatio(a, b []float64) float64 {
	var rs []float64
	for i := 0; i < len(a) && i < len(b); i++ {
		if b[i] > 0 && a[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	if len(rs)%2 == 1 {
		return rs[len(rs)/2]
	}
	return (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
}
