package manager

import (
	"fmt"
	"testing"
)

// TestNextAnomalyBatch: a sample reads at most n sandboxes, and successive
// samples visit every sandbox once per round, in order, wrapping around;
// a cursor that ended (no longer alive) is no obstacle.
func TestNextAnomalyBatch(t *testing.T) {
	var ids []string
	for i := 999; i >= 0; i-- {
		ids = append(ids, fmt.Sprintf("sb-%04d", i))
	}
	seen := map[string]int{}
	cursor := ""
	for round := 0; round < 4; round++ { // 4 x 256 >= 1000: one full round and a wrap
		b := nextAnomalyBatch(append([]string(nil), ids...), cursor, 256)
		if len(b) != 256 {
			t.Fatalf("batch %d: %d sandboxes, want 256", round, len(b))
		}
		for _, id := range b {
			seen[id]++
		}
		cursor = b[len(b)-1]
	}
	for _, id := range ids {
		if n := seen[id]; n < 1 || n > 2 {
			t.Fatalf("%s sampled %d times in 4 batches of 256 over 1000", id, n)
		}
	}
	if seen["sb-0000"] != 2 || seen["sb-0023"] != 2 || seen["sb-0024"] != 1 {
		t.Fatalf("wrap-around: sb-0000 %d, sb-0023 %d, sb-0024 %d", seen["sb-0000"], seen["sb-0023"], seen["sb-0024"])
	}
	if b := nextAnomalyBatch([]string{"b", "a", "c"}, "b", 256); len(b) != 3 {
		t.Fatalf("few sandboxes: %v, want all", b)
	}
	if b := nextAnomalyBatch(append([]string(nil), ids...), "sb-0499x", 2); b[0] != "sb-0500" || b[1] != "sb-0501" {
		t.Fatalf("after an ended cursor: %v", b)
	}
}
