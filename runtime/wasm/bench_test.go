package wasm

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/airlock-dev/airlock/runtime/native"
)

// The cold-start benchmarks run a module to completion (it prints one
// line) three ways: compiling it in a fresh engine (no cache), in a fresh
// engine whose disk cache already holds it (what `airlock run --runtime
// wasm` does on its second run), and in a warm engine (in-memory cache:
// what a long-lived server does). go test -run '^$' -bench . ./runtime/wasm
func benchStart(b *testing.B, m Module, cacheDir string, fresh bool) {
	ctx := context.Background()
	p := strict(b)
	cfg := native.Config{Policy: p, Args: []string{m.Name}}
	var e *Engine
	newEngine := func() {
		var err error
		if e, err = NewEngine(ctx, cacheDir); err != nil {
			b.Fatal(err)
		}
	}
	newEngine()
	if _, err := e.Run(ctx, m, cfg, native.RunOptions{}); err != nil { // fill the caches
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if fresh {
			e.Close()
			newEngine()
		}
		res, err := e.Run(ctx, m, cfg, native.RunOptions{})
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.StopTimer()
	e.Close()
}

func benchModules(b *testing.B, f func(b *testing.B, m Module)) {
	b.Run("hello-138B", func(b *testing.B) { f(b, Module{Name: "hello.wasm", Bytes: HelloModule()}) })
	b.Run("go-guest", func(b *testing.B) { f(b, guest(b)) })
}

func BenchmarkStartNoCache(b *testing.B) {
	benchModules(b, func(b *testing.B, m Module) { benchStart(b, m, "", true) })
}

func BenchmarkStartDiskCache(b *testing.B) {
	benchModules(b, func(b *testing.B, m Module) { benchStart(b, m, filepath.Join(b.TempDir(), "c"), true) })
}

func BenchmarkStartWarmEngine(b *testing.B) {
	benchModules(b, func(b *testing.B, m Module) { benchStart(b, m, "", false) })
}
