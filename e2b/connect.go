package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file implements the server side of the Connect protocol
// (https://connectrpc.com/docs/protocol) with the JSON codec only, over plain
// net/http: envd's RPCs are defined by protobuf messages, and connect-go
// would need generated protobuf types to serve them. The E2B SDKs always use
// the JSON codec (createConnectTransport with useBinaryFormat: false).

// Code is a Connect error code, as it appears in JSON error bodies.
type Code string

// The Connect error codes.
const (
	CodeCanceled           Code = "canceled"
	CodeUnknown            Code = "unknown"
	CodeInvalidArgument    Code = "invalid_argument"
	CodeDeadlineExceeded   Code = "deadline_exceeded"
	CodeNotFound           Code = "not_found"
	CodeAlreadyExists      Code = "already_exists"
	CodePermissionDenied   Code = "permission_denied"
	CodeResourceExhausted  Code = "resource_exhausted"
	CodeFailedPrecondition Code = "failed_precondition"
	CodeAborted            Code = "aborted"
	CodeOutOfRange         Code = "out_of_range"
	CodeUnimplemented      Code = "unimplemented"
	CodeInternal           Code = "internal"
	CodeUnavailable        Code = "unavailable"
	CodeDataLoss           Code = "data_loss"
	CodeUnauthenticated    Code = "unauthenticated"
)

// HTTPStatus is the HTTP status the Connect protocol assigns to a unary
// error with this code.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeCanceled:
		return 499
	case CodeInvalidArgument, CodeFailedPrecondition, CodeOutOfRange:
		return http.StatusBadRequest
	case CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case CodeNotFound:
		return http.StatusNotFound
	case CodeAlreadyExists, CodeAborted:
		return http.StatusConflict
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	case CodeUnimplemented:
		return http.StatusNotImplemented
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// Error is a Connect error: a code and a message for humans. Its JSON form
// is the Connect wire format of an error.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message,omitempty"`
}

// Error implements error.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// errorf builds a Connect error.
func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Envelope flags.
const (
	flagCompressed byte = 0x01
	flagEndStream  byte = 0x02
)

// envelopeHeader is the size of an envelope's prefix: flags and length.
const envelopeHeader = 5

// Errors of ReadEnvelope.
var (
	// ErrEnvelopeTooLarge means an envelope announced more bytes than the
	// reader accepts; nothing was allocated for it.
	ErrEnvelopeTooLarge = errors.New("connect: envelope larger than the limit")
	// ErrTruncatedEnvelope means the stream ended inside an envelope.
	ErrTruncatedEnvelope = errors.New("connect: truncated envelope")
)

// ReadEnvelope reads one envelope (a flags byte, a 4-byte big-endian length
// and that many bytes) from r. It returns io.EOF only when r ends cleanly
// before the first byte, ErrTruncatedEnvelope when it ends inside the
// envelope, and ErrEnvelopeTooLarge, without reading or allocating the
// payload, when the length exceeds max.
func ReadEnvelope(r io.Reader, max int) (flags byte, payload []byte, err error) {
	var hdr [envelopeHeader]byte
	n, err := io.ReadFull(r, hdr[:])
	switch {
	case err == io.EOF && n == 0:
		return 0, nil, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return 0, nil, ErrTruncatedEnvelope
	case err != nil:
		return 0, nil, err
	}
	size := binary.BigEndian.Uint32(hdr[1:])
	if max < 0 || uint64(size) > uint64(max) {
		return 0, nil, fmt.Errorf("%w: %d bytes, at most %d", ErrEnvelopeTooLarge, size, max)
	}
	payload = make([]byte, size)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, ErrTruncatedEnvelope
		}
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// AppendEnvelope appends payload to dst as one envelope with flags.
func AppendEnvelope(dst []byte, flags byte, payload []byte) []byte {
	var hdr [envelopeHeader]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	dst = append(dst, hdr[:]...)
	return append(dst, payload...)
}

// endStreamMessage is the JSON payload of the last envelope of a stream.
type endStreamMessage struct {
	Error *Error `json:"error,omitempty"`
}

// Limits of the Connect layer.
const (
	// maxRequestBytes caps a request message (unary body or envelope).
	maxRequestBytes = 4 << 20
	// maxTimeoutDigits is the longest Connect-Timeout-Ms the spec allows.
	maxTimeoutDigits = 10
)

// rpcCall is what a Connect handler gets besides its message.
type rpcCall struct {
	// r is the HTTP request.
	r *http.Request
	// timeout is Connect-Timeout-Ms; 0 when absent.
	timeout time.Duration
}

// parseTimeout reads the Connect-Timeout-Ms header.
func parseTimeout(h http.Header) (time.Duration, *Error) {
	v := h.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	if len(v) > maxTimeoutDigits || strings.TrimLeft(v, "0123456789") != "" {
		return 0, errorf(CodeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errorf(CodeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// mediaType returns the request's media type, lower-cased, and whether its
// charset (if any) is UTF-8.
func mediaType(h http.Header) (string, bool) {
	ct := h.Get("Content-Type")
	if ct == "" {
		return "", true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct)), false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		return mt, false
	}
	return mt, true
}

// unaryHandler serves one unary RPC: it gets the request message's JSON
// and returns the response message.
type unaryHandler func(ctx context.Context, call *rpcCall, req []byte) (any, error)

// streamHandler serves one server-streaming RPC: it sends messages with
// send and returns nil or the error that ends the stream.
type streamHandler func(ctx context.Context, call *rpcCall, req []byte, send func(msg any) error) error

// writeUnaryError writes a Connect unary error response.
func writeUnaryError(w http.ResponseWriter, e *Error) {
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Code.HTTPStatus())
	w.Write(b)
}

// serveUnary runs h as a Connect unary RPC with the JSON codec.
func serveUnary(w http.ResponseWriter, r *http.Request, h unaryHandler) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeUnaryError(w, errorf(CodeUnimplemented, "%s is not supported; use POST", r.Method))
		return
	}
	mt, utf8 := mediaType(r.Header)
	if mt != "application/json" || !utf8 {
		// The Connect spec: 415 and the supported types for an unknown codec.
		w.Header().Set("Accept-Post", "application/json")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		writeUnaryError(w, errorf(CodeUnimplemented, "request compression %q is not supported", enc))
		return
	}
	if v := r.Header.Get("Connect-Protocol-Version"); v != "" && v != "1" {
		writeUnaryError(w, errorf(CodeInvalidArgument, "unsupported Connect-Protocol-Version %q", v))
		return
	}
	timeout, cerr := parseTimeout(r.Header)
	if cerr != nil {
		writeUnaryError(w, cerr)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		writeUnaryError(w, errorf(CodeCanceled, "reading the request: %v", err))
		return
	}
	if len(body) > maxRequestBytes {
		writeUnaryError(w, errorf(CodeResourceExhausted, "request message larger than %d bytes", maxRequestBytes))
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	ctx := r.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := h(ctx, &rpcCall{r: r, timeout: timeout}, body)
	if err != nil {
		writeUnaryError(w, asConnectError(ctx, err))
		return
	}
	b, err := json.Marshal(resp)
	if err != nil {
		writeUnaryError(w, errorf(CodeInternal, "encoding the response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// streamWriter writes the envelopes of a server stream.
type streamWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu     sync.Mutex
	buf    []byte
	header bool
	ended  bool
}

func newStreamWriter(w http.ResponseWriter) *streamWriter {
	return &streamWriter{w: w, rc: http.NewResponseController(w)}
}

// writeHeader sends the response headers once.
func (s *streamWriter) writeHeader() {
	if s.header {
		return
	}
	s.header = true
	s.w.Header().Set("Content-Type", "application/connect+json")
	s.w.Header().Set("X-Content-Type-Options", "nosniff")
	s.w.WriteHeader(http.StatusOK)
}

// send writes one message envelope and flushes it.
func (s *streamWriter) send(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return errorf(CodeInternal, "encoding a message: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errors.New("connect: stream already ended")
	}
	s.writeHeader()
	s.buf = AppendEnvelope(s.buf[:0], 0, b)
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// end writes the end-of-stream envelope carrying err (nil for success).
func (s *streamWriter) end(err *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	s.writeHeader()
	b, _ := json.Marshal(endStreamMessage{Error: err})
	s.w.Write(AppendEnvelope(nil, flagEndStream, b))
	s.rc.Flush()
}

// serveStream runs h as a Connect server-streaming RPC with the JSON
// codec. Errors, including those found before the first message, travel
// in the end-of-stream envelope of a 200 response, as the spec requires.
func serveStream(w http.ResponseWriter, r *http.Request, h streamHandler) {
	sw := newStreamWriter(w)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		sw.end(errorf(CodeUnimplemented, "%s is not supported; use POST", r.Method))
		return
	}
	mt, utf8 := mediaType(r.Header)
	if mt != "application/connect+json" || !utf8 {
		w.Header().Set("Accept-Post", "application/connect+json")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	if enc := r.Header.Get("Connect-Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		sw.end(errorf(CodeUnimplemented, "stream compression %q is not supported", enc))
		return
	}
	if v := r.Header.Get("Connect-Protocol-Version"); v != "" && v != "1" {
		sw.end(errorf(CodeInvalidArgument, "unsupported Connect-Protocol-Version %q", v))
		return
	}
	timeout, cerr := parseTimeout(r.Header)
	if cerr != nil {
		sw.end(cerr)
		return
	}
	req, cerr := readStreamRequest(r.Body)
	if cerr != nil {
		sw.end(cerr)
		return
	}
	ctx := r.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	err := h(ctx, &rpcCall{r: r, timeout: timeout}, req, sw.send)
	if err != nil {
		sw.end(asConnectError(ctx, err))
		return
	}
	sw.end(nil)
}

// readStreamRequest reads the single request envelope of a server stream
// and checks that nothing follows it.
func readStreamRequest(body io.Reader) ([]byte, *Error) {
	flags, payload, err := ReadEnvelope(body, maxRequestBytes)
	switch {
	case err == io.EOF:
		return nil, errorf(CodeInvalidArgument, "missing request message")
	case errors.Is(err, ErrEnvelopeTooLarge):
		return nil, errorf(CodeResourceExhausted, "%v", err)
	case err != nil:
		return nil, errorf(CodeInvalidArgument, "reading the request: %v", err)
	}
	if flags&flagCompressed != 0 {
		return nil, errorf(CodeInternal, "compressed request message without a negotiated encoding")
	}
	if flags&flagEndStream != 0 || flags&^(flagCompressed|flagEndStream) != 0 {
		return nil, errorf(CodeInvalidArgument, "bad request envelope flags %#x", flags)
	}
	// A server stream takes exactly one request message.
	var one [1]byte
	if n, _ := io.ReadFull(body, one[:]); n > 0 {
		return nil, errorf(CodeInvalidArgument, "more than one request message on a server stream")
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		payload = []byte("{}")
	}
	return payload, nil
}

// asConnectError turns any handler error into a Connect error.
func asConnectError(ctx context.Context, err error) *Error {
	var ce *Error
	if errors.As(err, &ce) {
		return ce
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errorf(CodeDeadlineExceeded, "the request's timeout (Connect-Timeout-Ms) passed")
	case errors.Is(err, context.Canceled):
		return errorf(CodeCanceled, "request canceled")
	}
	return agentRPCError(err)
}

// decodeMessage decodes a request message. Unknown fields are ignored, as
// protobuf's JSON mapping allows (connect-go does the same), so that newer
// SDKs keep working.
func decodeMessage(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return errorf(CodeInvalidArgument, "malformed request message: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(CodeInvalidArgument, "trailing data after the request message")
	}
	return nil
}
