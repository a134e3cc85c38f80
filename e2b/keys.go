package e2b

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/airlock-dev/airlock/store"
)

// E2B SDKs from 2.30 to 2.45 (JS) and the Python SDK check, before sending
// anything, that the API key is "e2b_" followed by hex digits, unless the
// user sets E2B_VALIDATE_API_KEY=false. An airlock secret is "al_" and 32
// random bytes in base64url; the same 32 bytes in hex, after "e2b_", are
// its E2B form. The two spellings are one key: the E2B endpoints turn the
// E2B form back into the airlock one before authenticating, so nothing is
// stored twice and revoking the key revokes both.

// KeyPrefix starts the E2B form of an airlock API key.
const KeyPrefix = "e2b_"

// E2BKey returns the E2B form ("e2b_" and 64 hex digits) of an airlock API
// key secret.
func E2BKey(secret string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, store.SecretPrefix))
	if !strings.HasPrefix(secret, store.SecretPrefix) || err != nil || len(raw) != 32 {
		return "", errors.New("e2b: not an airlock API key secret")
	}
	return KeyPrefix + hex.EncodeToString(raw), nil
}

// airlockKey returns the airlock secret a key given to the E2B endpoints
// stands for: the E2B form is converted, anything else is returned as is
// (and authenticated, or refused, as such).
func airlockKey(key string) string {
	h, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok || len(h) != 64 {
		return key
	}
	raw, err := hex.DecodeString(h)
	if err != nil {
		return key
	}
	return store.SecretPrefix + base64.RawURLEncoding.EncodeToString(raw)
}
