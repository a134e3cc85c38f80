package testserver

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// PostJSON sends an authenticated JSON POST (Bearer key) and decodes the
// JSON answer.
func PostJSON(t testing.TB, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v
}
