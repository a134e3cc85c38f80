package e2b

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/egress"
)

// E2B's secrets (GET/POST /secrets, GET/POST/DELETE /secrets/{id}) are
// values a key stores on the server and names in a sandbox's
// network.rules as ${e2b.secrets.NAME}: the egress proxy adds them to the
// sandbox's requests (airlock's injected headers), so a value never enters
// a sandbox. They belong to the key that stored them; no answer ever
// carries a value.

// Limits of the secrets a key keeps.
const (
	maxSecretsPerKey = 100
	maxSecretValue   = 8 << 10
)

// secretRecord is one stored secret: its versions' values, the newest
// last.
type secretRecord struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Values    []string          `json:"values"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// secretInfo is E2B's Secret: everything but the value.
type secretInfo struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int               `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

func (s *secretRecord) info() secretInfo {
	md := s.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return secretInfo{SecretID: s.ID, Name: s.Name, CurrentVersion: len(s.Values), Metadata: md, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// secretStore keeps each key's secrets in a file of its own (mode 0600)
// under dir.
type secretStore struct {
	dir string
	mu  sync.Mutex
}

// file is where owner's secrets are: named by a hash of the owner, so no
// key id ever makes a path.
func (s *secretStore) file(owner string) string {
	h := sha256.Sum256([]byte("e2b-secrets\x00" + owner))
	return filepath.Join(s.dir, hex.EncodeToString(h[:16])+".json")
}

// load reads owner's secrets; the caller holds s.mu.
func (s *secretStore) load(owner string) ([]secretRecord, error) {
	b, err := os.ReadFile(s.file(owner))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("e2b: secrets: %w", err)
	}
	var recs []secretRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		return nil, fmt.Errorf("e2b: secrets of this key are unreadable: %w", err)
	}
	return recs, nil
}

// save writes owner's secrets atomically; the caller holds s.mu.
func (s *secretStore) save(owner string, recs []secretRecord) error {
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.file(owner), b)
}

// find loads owner's secrets and finds the one ref names (its id or
// name): E2B's 404 if there is none. The caller holds s.mu.
func (s *secretStore) find(owner, ref string) ([]secretRecord, int, error) {
	recs, err := s.load(owner)
	if err != nil {
		return nil, 0, err
	}
	i := findSecret(recs, ref)
	if i < 0 {
		return nil, 0, apiErrorf(http.StatusNotFound, "secret %q not found", ref)
	}
	return recs, i, nil
}

// findSecret returns the index of the secret ref names (its id or name)
// among recs, or -1.
func findSecret(recs []secretRecord, ref string) int {
	for i := range recs {
		if recs[i].ID == ref || recs[i].Name == strings.ToLower(ref) {
			return i
		}
	}
	return -1
}

// secretName checks and canonicalises a secret name as E2B does (lower
// case; no braces or control characters, since it is interpolated into a
// placeholder; sec_ is reserved for ids).
func secretName(name string) (string, error) {
	n := strings.ToLower(name)
	if n == "" || len(n) > 128 || strings.HasPrefix(n, "sec_") || strings.ContainsAny(n, "{}") {
		return "", apiErrorf(http.StatusBadRequest, "secret name %q: 1 to 128 characters, no '{' or '}', not starting with sec_", name)
	}
	for _, c := range n {
		if c < 0x20 || c == 0x7f {
			return "", apiErrorf(http.StatusBadRequest, "secret name %q has a control character", name)
		}
	}
	return n, nil
}

// secretValue checks a value to store.
func secretValue(v string) error {
	if v == "" || len(v) > maxSecretValue || strings.ContainsAny(v, "\r\n\x00") {
		return apiErrorf(http.StatusBadRequest, "a secret value is 1 to %d bytes, without line breaks or NUL (it becomes a header value)", maxSecretValue)
	}
	return nil
}

func (h *Handler) secretsOr501() (*secretStore, error) {
	if h.secrets == nil {
		return nil, apiErrorf(http.StatusNotImplemented, "this server keeps no secrets (it has no state directory)")
	}
	return h.secrets, nil
}

// listSecrets serves GET /secrets (limit, nextToken): the key's secrets,
// oldest first, without values.
func (h *Handler) listSecrets(w http.ResponseWriter, r *http.Request) error {
	s, err := h.secretsOr501()
	if err != nil {
		return err
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 1000 {
			return apiErrorf(http.StatusBadRequest, "limit must be between 1 and 1000")
		}
	}
	s.mu.Lock()
	recs, err := s.load(callerOf(r.Context()).id)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].CreatedAt.Before(recs[j].CreatedAt) })
	out := []secretInfo{}
	after := r.URL.Query().Get("nextToken")
	for _, rec := range recs {
		if after != "" {
			if rec.ID == after {
				after = ""
			}
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SecretID)
			break
		}
		out = append(out, rec.info())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createSecret serves POST /secrets ({name, value, metadata}): 201.
func (h *Handler) createSecret(w http.ResponseWriter, r *http.Request) error {
	s, err := h.secretsOr501()
	if err != nil {
		return err
	}
	var req struct {
		Name     string            `json:"name"`
		Value    string            `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	name, err := secretName(req.Name)
	if err != nil {
		return err
	}
	if err := secretValue(req.Value); err != nil {
		return err
	}
	owner := callerOf(r.Context()).id
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := s.load(owner)
	if err != nil {
		return err
	}
	if findSecret(recs, name) >= 0 {
		return apiErrorf(http.StatusConflict, "a secret named %q exists: update it instead", name)
	}
	if len(recs) >= maxSecretsPerKey {
		return apiErrorf(http.StatusTooManyRequests, "this key keeps %d secrets, its quota", len(recs))
	}
	b := make([]byte, 12)
	rand.Read(b)
	now := time.Now().UTC()
	rec := secretRecord{ID: "sec_" + hex.EncodeToString(b), Name: name, Values: []string{req.Value}, Metadata: req.Metadata, CreatedAt: now, UpdatedAt: now}
	if err := s.save(owner, append(recs, rec)); err != nil {
		return err
	}
	h.m.Audit(r.Context(), owner, "", "e2b.secret_create", map[string]any{"secret": rec.ID, "name": name})
	writeJSON(w, http.StatusCreated, rec.info())
	return nil
}

// updateSecret serves POST /secrets/{id} ({value, metadata}): a new
// version. Sandboxes already running keep the value they were given.
func (h *Handler) updateSecret(w http.ResponseWriter, r *http.Request) error {
	s, err := h.secretsOr501()
	if err != nil {
		return err
	}
	var req struct {
		Value    string            `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if err := secretValue(req.Value); err != nil {
		return err
	}
	owner := callerOf(r.Context()).id
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, i, err := s.find(owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	recs[i].Values = append(recs[i].Values, req.Value)
	if len(recs[i].Values) > 10 {
		recs[i].Values = recs[i].Values[len(recs[i].Values)-10:]
	}
	if req.Metadata != nil {
		recs[i].Metadata = req.Metadata
	}
	recs[i].UpdatedAt = time.Now().UTC()
	if err := s.save(owner, recs); err != nil {
		return err
	}
	h.m.Audit(r.Context(), owner, "", "e2b.secret_update", map[string]any{"secret": recs[i].ID})
	writeJSON(w, http.StatusOK, recs[i].info())
	return nil
}

// getSecret serves GET /secrets/{id}: its description, never its value.
func (h *Handler) getSecret(w http.ResponseWriter, r *http.Request) error {
	s, err := h.secretsOr501()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, i, err := s.find(callerOf(r.Context()).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, recs[i].info())
	return nil
}

// deleteSecret serves DELETE /secrets/{id}: 204, or 404.
func (h *Handler) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	s, err := h.secretsOr501()
	if err != nil {
		return err
	}
	owner := callerOf(r.Context()).id
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, i, err := s.find(owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	id := recs[i].ID
	if err := s.save(owner, append(recs[:i:i], recs[i+1:]...)); err != nil {
		return err
	}
	h.m.Audit(r.Context(), owner, "", "e2b.secret_delete", map[string]any{"secret": id})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// placeholder is E2B's reference to a stored secret in a header value.
var placeholder = regexp.MustCompile(`\$\{e2b\.secrets\.([^{}]*)\}`)

// resolveSecrets replaces the ${e2b.secrets.NAME} placeholders in the
// values of injected headers with owner's stored secrets' current values,
// and returns the names used (for the audit). A name the key has not
// stored is a 400: the header is never sent with the placeholder itself.
func (h *Handler) resolveSecrets(owner string, secrets []egress.Secret) ([]egress.Secret, []string, error) {
	var need bool
	for _, sec := range secrets {
		need = need || placeholder.MatchString(sec.Value)
	}
	if !need {
		return secrets, nil, nil
	}
	s, err := h.secretsOr501()
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	recs, err := s.load(owner)
	s.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	used := map[string]bool{}
	out := make([]egress.Secret, len(secrets))
	for i, sec := range secrets {
		var missing string
		sec.Value = placeholder.ReplaceAllStringFunc(sec.Value, func(m string) string {
			name := placeholder.FindStringSubmatch(m)[1]
			j := findSecret(recs, name)
			if j < 0 || strings.HasPrefix(name, "sec_") {
				missing = name
				return ""
			}
			used[recs[j].Name] = true
			return recs[j].Values[len(recs[j].Values)-1]
		})
		if missing != "" {
			return nil, nil, apiErrorf(http.StatusBadRequest, "network.rules for %s name the secret %q, which this key has not stored (Secret.create)", sec.Host, missing)
		}
		out[i] = sec
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	return out, names, nil
}
