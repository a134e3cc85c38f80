package approval

import (
	"context"
	"testing"
)

// BenchmarkCheckNoRules is the cost an exec pays on a server without any
// policy: the key's policy file is looked up and not found.
func BenchmarkCheckNoRules(b *testing.B) {
	g, err := New(Config{KeyPolicy: KeyPolicies(b.TempDir()), SandboxPolicyDir: b.TempDir(),
		Audit: func(context.Context, string, string, string, any) error { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	a := Action{Kind: KindExec, Owner: "key_0123456789abcdef", Sandbox: "sb-0123456789abcdef", Argv: []string{"ls", "-l"}}
	for b.Loop() {
		if err := g.Check(context.Background(), a, nil); err != nil {
			b.Fatal(err)
		}
	}
}
