package server_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestListPaging: listings come in pages of at most limit, with next to
// resume after, and the client follows them to the end.
func TestListPaging(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "paging")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	want := map[string]bool{}
	for i := 0; i < 3; i++ {
		sb, err := c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"page": "yes"}, Timeout: 120})
		if err != nil {
			t.Fatal(err)
		}
		want[sb.ID] = true
	}
	page := func(q string) (ids []string, next string) {
		req, _ := http.NewRequest("GET", s.URL+"/v1/sandboxes?metadata.page=yes&limit=2"+q, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Sandboxes []struct{ ID string }
			Next      string
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		for _, sb := range out.Sandboxes {
			ids = append(ids, sb.ID)
		}
		return ids, out.Next
	}
	first, next := page("")
	if len(first) != 2 || next != first[1] {
		t.Fatalf("first page %v next %q", first, next)
	}
	second, next2 := page("&after=" + next)
	if len(second) != 1 || next2 != "" || second[0] <= first[1] {
		t.Fatalf("second page %v next %q", second, next2)
	}
	all, err := c.List(ctx, map[string]string{"page": "yes"})
	if err != nil || len(all) != 3 {
		t.Fatalf("client list: %d %v", len(all), err)
	}
	for _, sb := range all {
		if !want[sb.ID] {
			t.Fatalf("unexpected %s", sb.ID)
		}
	}
}
