package interp_test

import (
	"context"
	"testing"

	"github.com/airlock-dev/airlock/interp"
)

// benchCell measures the round trip of one small cell in a warm kernel.
func benchCell(b *testing.B, lang interp.Language, code, want string) {
	k := start(b, interp.Config{Language: lang})
	ctx := context.Background()
	for i := 0; i < 20; i++ { // warm up
		if _, err := k.Execute(ctx, code, 0, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := k.Execute(ctx, code, 0, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		if res.Error != nil {
			b.Fatalf("cell failed: %v", res.Error)
		}
		if want != "" && (len(res.Results) != 1 || res.Results[0]["text/plain"] != want) {
			b.Fatalf("got %+v, want %s", res.Results, want)
		}
	}
}

// BenchmarkPythonCell is the round trip of `1+1` in a warm Python kernel.
func BenchmarkPythonCell(b *testing.B) { benchCell(b, interp.Python, "1+1", "2") }

// BenchmarkJavaScriptCell is the round trip of `1+1` in a warm node kernel.
func BenchmarkJavaScriptCell(b *testing.B) { benchCell(b, interp.JavaScript, "1+1", "2") }

// BenchmarkBashCell is the round trip of `X=$((1+1))` in a warm bash kernel.
func BenchmarkBashCell(b *testing.B) { benchCell(b, interp.Bash, "X=$((1+1))", "") }

// BenchmarkPythonStart is the time to start a Python kernel and get it ready.
func BenchmarkPythonStart(b *testing.B) {
	for i := 0; i < b.N; i++ {
		k, err := interp.Start(context.Background(), interp.Config{Language: interp.Python})
		if err != nil {
			b.Fatal(err)
		}
		k.Close()
	}
}
