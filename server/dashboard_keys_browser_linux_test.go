package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/airlock-dev/airlock/client"
)

// TestDashboardKeysInBrowser drives the Keys page in headless Chromium: an
// admin session sees it, creates a key with limits (its secret shown once,
// working, and gone from the page once closed or reloaded), edits its
// limits and revokes it (one click arms, a second revokes), each checked
// through the API; the page fits 1280 and 390 px. A non-admin session has
// no Keys link and the page lists nothing. No console error.
func TestDashboardKeysInBrowser(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	adminSecret, _ := keyWithID(t, "--name", "ops", "--admin", "--state-dir", state)
	userSecret, userID := keyWithID(t, "--name", "agent", "--state-dir", state)
	s := startServer(t, state)
	base := s.URL
	ctx := ctxT(t)
	ac := client.New(base, adminSecret)
	b := newBrowser(t)

	b.run(t, "open", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("key")))
	b.run(t, "log in", chromedp.SendKeys(chromedp.ID("key"), adminSecret), chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitText(t, "#who", "key ")
	b.waitJS(t, `!document.getElementById("nav-keys").hidden`, `"hidden"`, "the Keys link for an admin session")
	b.run(t, "keys page", chromedp.Click(chromedp.ID("nav-keys")))
	b.waitText(t, "#keys", "agent")
	b.waitText(t, `#keys tr[data-id="`+userID+`"]`, "live")
	b.waitText(t, `#keys tr[data-id="`+userID+`"]`, "never") // its last use: the user key has not logged in yet

	// Create: the secret is shown once.
	b.run(t, "create a key", chromedp.SendKeys(chromedp.ID("key-name"), "from-dash"), chromedp.SendKeys(chromedp.ID("key-pids"), "64"),
		chromedp.SendKeys(chromedp.ID("key-memory"), "256"), chromedp.Click(chromedp.ID("key-create")))
	b.waitText(t, "#key-secret", "shown only this once")
	secret, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.ID("key-secret-value")))
	if err != nil {
		t.Fatal(err)
	}
	secret = strings.TrimSpace(secret)
	if !strings.HasPrefix(secret, "al_") {
		t.Fatalf("the page shows secret %q", secret)
	}
	if _, err := client.New(base, secret).List(ctx, nil); err != nil {
		t.Fatalf("the key made in the page: %v", err)
	}
	var id string
	keys, err := ac.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Name == "from-dash" {
			id = k.ID
			if k.Admin || k.Limits.Pids != 64 || k.Limits.MemoryBytes != 256<<20 {
				t.Fatalf("the page's key: %+v", k)
			}
		}
	}
	if id == "" {
		t.Fatalf("no key from-dash in %+v", keys)
	}
	b.waitText(t, `#keys tr[data-id="`+id+`"]`, "pids 64")
	b.shot(t, "keys-created")
	b.run(t, "close the secret", chromedp.Click(chromedp.ID("key-secret-done")))
	b.waitJS(t, `document.getElementById("key-secret").hidden && !document.body.innerHTML.includes(`+jsString(secret)+`)`,
		`document.getElementById("key-secret").textContent`, "the secret gone from the page")
	b.run(t, "reload", chromedp.Reload())
	b.waitText(t, "#keys", "from-dash")
	if has, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.documentElement.outerHTML.includes(`+jsString(secret)+`) || JSON.stringify(localStorage).includes("al_") || JSON.stringify(sessionStorage).includes("al_")`)); err != nil || has {
		t.Fatalf("the secret is still in the page or its storage after a reload: %v %v", has, err)
	}

	// Edit limits.
	row := `#keys tr[data-id="` + id + `"]`
	b.run(t, "edit limits", chromedp.Click(chromedp.CSS(row+` button.limits`)), chromedp.WaitVisible(chromedp.ID("edit-form")))
	b.run(t, "set limits", chromedp.SetValue(chromedp.ID("edit-max-sandboxes"), "4"), chromedp.SetValue(chromedp.ID("edit-pids"), ""),
		chromedp.Click(chromedp.ID("edit-save")))
	b.waitText(t, "#keys-status", "saved")
	b.waitText(t, row, "memory 256 MiB")
	if k, err := keyByID(ctx, ac, id); err != nil || k.MaxSandboxes != 4 || k.Limits.Pids != 0 || k.Limits.MemoryBytes != 256<<20 {
		t.Fatalf("after the page's limits: %+v, %v", k, err)
	}
	b.shot(t, "keys")

	// Revoke: one click only arms the button.
	b.run(t, "revoke (armed)", chromedp.Click(chromedp.CSS(row+` button.revoke`)))
	b.waitText(t, row+` button.revoke`, "Really revoke?")
	if k, err := keyByID(ctx, ac, id); err != nil || k.RevokedAt != nil {
		t.Fatalf("one click on Revoke revoked the key: %+v, %v", k, err)
	}
	b.run(t, "revoke (confirmed)", chromedp.Click(chromedp.CSS(row+` button.revoke`)))
	b.waitText(t, row, "revoked")
	if _, err := client.New(base, secret).List(ctx, nil); err == nil {
		t.Fatal("the key revoked in the page still works")
	}

	// A phone's width.
	b.run(t, "narrow", chromedp.EmulateViewport(390, 844), chromedp.Reload())
	b.waitText(t, "#keys", "from-dash")
	b.waitJS(t, `document.documentElement.scrollWidth <= window.innerWidth + 1`,
		`document.documentElement.scrollWidth + " > " + window.innerWidth`, "the Keys page to fit 390 px")
	b.shot(t, "narrow-keys")
	b.run(t, "wide", chromedp.EmulateViewport(1280, 900))

	// A non-admin session: no link, and the page lists nothing.
	b.run(t, "log out", chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("key")))
	b.run(t, "log in as a user", chromedp.SendKeys(chromedp.ID("key"), userSecret), chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitText(t, "#who", "key ")
	b.run(t, "user's keys page", chromedp.Navigate(base+"/#/keys"))
	b.waitText(t, "#main", "Only an admin key")
	if hidden, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.getElementById("nav-keys").hidden && !document.getElementById("keys")`)); err != nil || !hidden {
		t.Fatalf("a non-admin session sees the Keys link or list: %v %v", hidden, err)
	}
	b.noErrors(t)
}

// keyByID finds a key through the admin API.
func keyByID(ctx context.Context, c *client.Client, id string) (*client.Key, error) {
	keys, err := c.Keys(ctx)
	if err != nil {
		return nil, err
	}
	for i := range keys {
		if keys[i].ID == id {
			return &keys[i], nil
		}
	}
	return nil, fmt.Errorf("no key %s", id)
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
