package bench

import (
	"math"
	"sort"
)

// Median returns the median of xs, averaging the two middle values when
// len(xs) is even. NaN values are ignored. It returns NaN when no value is
// left. xs is not modified.
func Median(xs []float64) float64 {
	s := finite(xs)
	if len(s) == 0 {
		return math.NaN()
	}
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// MinMax returns the smallest and largest non-NaN values of xs, or NaN, NaN
// when there are none.
func MinMax(xs []float64) (lo, hi float64) {
	lo, hi = math.NaN(), math.NaN()
	for _, x := range xs {
		if math.IsNaN(x) {
			continue
		}
		if math.IsNaN(lo) || x < lo {
			lo = x
		}
		if math.IsNaN(hi) || x > hi {
			hi = x
		}
	}
	return lo, hi
}

// PairRatios returns ref[i]/other[i] for every index where both values are
// present (not NaN) and other[i] is not zero. The slices are the per-round
// samples of two peers measured in the same rounds, so each ratio compares
// two runs made next to each other in time.
func PairRatios(ref, other []float64) []float64 {
	n := min(len(ref), len(other))
	out := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		a, b := ref[i], other[i]
		if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
			continue
		}
		out = append(out, a/b)
	}
	return out
}

// finite returns a copy of xs without NaN values.
func finite(xs []float64) []float64 {
	out := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			out = append(out, x)
		}
	}
	return out
}
