package approval

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Signature headers of webhook deliveries and signed answers.
const (
	// SignatureHeader carries "sha256=" and the hex HMAC-SHA256, keyed
	// with the webhook secret, of TimestampHeader's value, a dot and the
	// body.
	SignatureHeader = "X-Airlock-Signature"
	// TimestampHeader is the Unix time of signing, in seconds.
	TimestampHeader = "X-Airlock-Timestamp"
	// MaxSkew is how far a signed answer's timestamp may be from now.
	MaxSkew = 5 * time.Minute
	// MinSecret is the shortest webhook secret accepted, in bytes.
	MinSecret = 16
)

// Webhook delivers pending approvals to a URL, signed, with retries.
type Webhook struct {
	// URL receives a POST per pending approval.
	URL string
	// Secret keys the signatures.
	Secret []byte
	// Client sends the requests; nil means one with a 10 s timeout.
	Client *http.Client
	// Attempts is how many times a delivery is tried; 0 means 5.
	Attempts int
	// Backoff is the wait after the first failure, doubled after each;
	// 0 means 500 ms.
	Backoff time.Duration
}

// NewWebhook checks the URL and secret.
func NewWebhook(rawURL string, secret []byte) (*Webhook, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("approval webhook %q: want an http:// or https:// URL", rawURL)
	}
	if len(secret) < MinSecret {
		return nil, fmt.Errorf("approval webhook: the secret must be at least %d bytes", MinSecret)
	}
	return &Webhook{URL: rawURL, Secret: secret}, nil
}

// Sign returns the signature header value for body signed at ts.
func Sign(secret []byte, ts int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%d.", ts)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// ErrSignature: a signed request's signature or timestamp is wrong.
var ErrSignature = errors.New("bad signature")

// Verify checks a signature made by Sign with a timestamp within MaxSkew
// of now.
func Verify(secret []byte, tsHeader, sig string, body []byte, now time.Time) error {
	ts, err := strconv.ParseInt(tsHeader, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is not a Unix time", ErrSignature, TimestampHeader)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > MaxSkew || d < -MaxSkew {
		return fmt.Errorf("%w: timestamp more than %s from the server's clock", ErrSignature, MaxSkew)
	}
	if !strings.HasPrefix(sig, "sha256=") || !hmac.Equal([]byte(Sign(secret, ts, body)), []byte(sig)) {
		return fmt.Errorf("%w: %s does not match the body", ErrSignature, SignatureHeader)
	}
	return nil
}

// Delivery is the JSON body POSTed to the webhook.
type Delivery struct {
	Type     string  `json:"type"`
	Approval Pending `json:"approval"`
	// AnswerPath is where to POST the answer, relative to the server.
	AnswerPath string `json:"answer_path"`
}

// Deliver POSTs p until the receiver answers 2xx, the attempts run out or
// ctx ends (the approval was answered or expired).
func (w *Webhook) Deliver(ctx context.Context, p *Pending) error {
	body, err := json.Marshal(Delivery{Type: "approval.requested", Approval: *p, AnswerPath: "/v1/approvals/" + p.ID})
	if err != nil {
		return err
	}
	c := w.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	attempts, backoff := w.Attempts, w.Backoff
	if attempts <= 0 {
		attempts = 5
	}
	if backoff <= 0 {
		backoff = 500 * time.Millisecond
	}
	var last error
	for i := range attempts {
		if i > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("gave up after %d attempts: %w", i, last)
			case <-time.After(backoff):
			}
			backoff *= 2
		}
		if last = w.post(ctx, c, body); last == nil {
			return nil
		}
	}
	return fmt.Errorf("gave up after %d attempts: %w", attempts, last)
}

func (w *Webhook) post(ctx context.Context, c *http.Client, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, "POST", w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(TimestampHeader, strconv.FormatInt(ts, 10))
	req.Header.Set(SignatureHeader, Sign(w.Secret, ts, body))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", w.URL, resp.Status)
	}
	return nil
}
