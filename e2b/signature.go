package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Signed file URLs: the SDKs' uploadUrl and downloadUrl return envd's
// /files URL with a signature in its query, for callers that hold no token
// (a browser, curl, another service). The signature is the SDKs' own:
// "v1_" and the unpadded standard base64 of
// sha256("PATH:OPERATION:USER:TOKEN[:EXPIRATION]"), with OPERATION "read"
// or "write", USER the username parameter (empty when absent), TOKEN the
// sandbox's envd access token and EXPIRATION, when the URL has a
// signature_expiration parameter, that Unix time in seconds.

// signatureVersion prefixes every signature the SDKs compute.
const signatureVersion = "v1_"

// fileSignature computes the signature of a /files URL.
func fileSignature(path, operation, user, token, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return signatureVersion + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedFileRequest reports whether r is a request to envd's /files that
// carries a signature instead of an access token.
func signedFileRequest(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Has("signature")
}

// checkFileSignature verifies the signature of a signed /files request
// for the sandbox whose envd token is token. It binds the operation (GET
// and HEAD read, POST writes), the path and the user, and refuses a URL
// past its expiration. It returns a message for a 401 when the request
// must be refused.
func checkFileSignature(r *http.Request, token string, now time.Time) (string, bool) {
	q := r.URL.Query()
	for _, k := range []string{"signature", "signature_expiration", "path", "username"} {
		if len(q[k]) > 1 {
			return "signed URL with a repeated " + k + " parameter", false
		}
	}
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return "a signed URL is only valid for GET (download) or POST (upload)", false
	}
	p := q.Get("path")
	if p == "" {
		// Without a path, an upload names its files in the parts: the
		// signature would bind no path at all.
		return "a signed URL must name the file in its path parameter", false
	}
	exp := q.Get("signature_expiration")
	var sec int64
	if exp != "" {
		var err error
		if sec, err = strconv.ParseInt(exp, 10, 64); err != nil {
			return "bad signature_expiration " + strconv.Quote(exp) + ": want Unix seconds", false
		}
	}
	// As envd: the signature first, then its expiry, in envd's words.
	want := fileSignature(p, op, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return fmt.Sprintf("invalid signature: it is not the signature of a %s of %q for this sandbox (a download URL cannot upload, nor an upload URL download)", op, p), false
	}
	if exp != "" && now.Unix() > sec {
		// envd's words exactly: E2B's tests compare the whole body.
		return "signature is already expired", false
	}
	return "", true
}
