package approval

import (
	"os"
	"regexp"
	"testing"
)

// TestDocsExamplesParse: every JSON and YAML policy in docs/approvals.md
// is a valid policy.
func TestDocsExamplesParse(t *testing.T) {
	b, err := os.ReadFile("../docs/approvals.md")
	if err != nil {
		t.Fatal(err)
	}
	ex := regexp.MustCompile("(?s)```(json|yaml)\n(.*?)```").FindAllSubmatch(b, -1)
	if len(ex) < 2 {
		t.Fatalf("found %d policy examples in docs/approvals.md", len(ex))
	}
	for _, m := range ex {
		p, err := Parse(m[2])
		if err != nil {
			t.Errorf("%s example: %v", m[1], err)
		} else if p.Empty() {
			t.Errorf("%s example has no rules", m[1])
		}
	}
}
