package agent

import (
	"testing"
	"time"
)

// TestMemPollInterval: the memory watcher looks every memPollFast above
// half the limit; below, never later than the workload could reach the
// limit allocating memFillRate bytes a second (nor later than memPollMax,
// nor sooner than memPollSlow).
func TestMemPollInterval(t *testing.T) {
	const mib = 1 << 20
	for _, limit := range []int64{64 * mib, 512 * mib, 2 << 30, 4 << 30, 64 << 30} {
		for _, used := range []int64{0, 1 * mib, limit / 4, limit/2 - 1, limit / 2, limit/2 + 1, limit, 2 * limit} {
			d := memPollInterval(used, limit)
			if used > limit/2 {
				if d != memPollFast {
					t.Errorf("limit %d, used %d: %s, want %s above half the limit", limit, used, d, memPollFast)
				}
				continue
			}
			if d < memPollSlow || d > memPollMax {
				t.Errorf("limit %d, used %d: %s, outside [%s, %s]", limit, used, d, memPollSlow, memPollMax)
			}
			reach := time.Duration(float64(limit-used) / memFillRate * float64(time.Second))
			if d > max(reach, memPollSlow) {
				t.Errorf("limit %d, used %d: waits %s, but the limit can be reached in %s", limit, used, d, reach)
			}
		}
	}
}
