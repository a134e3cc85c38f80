// Package testbrowser starts a headless Chromium for tests (Debian's, which
// scripts/setup.sh --tests installs) driven by chromedp, on a fresh
// profile, recording the console errors, uncaught exceptions and CSP
// violations of its pages.
package testbrowser

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path is Debian's chromium.
const Path = "/usr/bin/chromium"

// Browser is a running headless Chromium.
type Browser struct {
	// Ctx drives its first tab (chromedp.Run, chromedp.Do); it ends after
	// the timeout Start was given, or with the test.
	Ctx context.Context

	mu     sync.Mutex
	errors []string
}

// Start starts Chromium for t, which it skips, saying so, when Chromium
// is not installed; extra are more allocator options (flags).
func Start(t testing.TB, timeout time.Duration, extra ...chromedp.ExecAllocatorOption) *Browser {
	t.Helper()
	if _, err := os.Stat(Path); err != nil {
		t.Skipf("no %s (apt-get install chromium; scripts/setup.sh --tests does): %v", Path, err)
	}
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelC := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() { cancelC(); cancelB(); cancelA() })
	b := &Browser{Ctx: ctx}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			// Failed fetches (a poll racing a kill) are the page's
			// business; exceptions, console.error and CSP violations are not.
			if (m.Type == chromedp.ConsoleError || m.IsException()) && m.Source != "network" {
				b.mu.Lock()
				b.errors = append(b.errors, m.String()+" ("+m.Source+" "+m.URL+")")
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// Errors returns the console errors, exceptions and CSP violations seen
// so far.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}
