package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/store"
)

// envd's HTTP file endpoints: GET /files?path= downloads a file's bytes;
// POST /files?path= uploads one or more files, as multipart/form-data parts
// named "file" (each part's file name is its path when the path parameter
// is absent) or, from envd 0.5.7, as one application/octet-stream body,
// optionally gzip-compressed. Both answer errors as {"code", "message"}
// with code the HTTP status, which the SDKs map to their error classes
// (404 FileNotFoundError, 400 InvalidArgumentError, 507
// NotEnoughSpaceError).

// fileHTTPError maps an agent failure to an HTTP status and message.
func fileHTTPError(err error) (int, string) {
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound:
			return http.StatusNotFound, ae.Message
		case agent.CodeNotADirectory, agent.CodeIsADirectory, agent.CodeNotRegular, agent.CodeInvalidArgument,
			agent.CodeCrossDevice, agent.CodeExists:
			return http.StatusBadRequest, ae.Message
		case agent.CodePermissionDenied:
			return http.StatusForbidden, ae.Message
		case agent.CodeTooLarge:
			return http.StatusRequestEntityTooLarge, ae.Message
		case agent.CodeNoSpace:
			return http.StatusInsufficientStorage, ae.Message
		}
		return http.StatusInternalServerError, ae.Code + ": " + ae.Message
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || errors.Is(err, errFileTooLarge) {
		return http.StatusRequestEntityTooLarge, err.Error()
	}
	if errors.Is(err, agent.ErrClosed) || errors.Is(err, agent.ErrProtocol) {
		return http.StatusBadGateway, "the sandbox is not running: " + err.Error()
	}
	return http.StatusInternalServerError, err.Error()
}

// fileQuery checks the common query parameters of /files.
func fileQuery(w http.ResponseWriter, r *http.Request) (string, bool) {
	q := r.URL.Query()
	if len(q["path"]) > 1 {
		writeAPIError(w, http.StatusBadRequest, "repeated path parameter")
		return "", false
	}
	if e := checkUser(r, q.Get("username")); e != nil {
		writeAPIError(w, http.StatusUnauthorized, e.Message)
		return "", false
	}
	return q.Get("path"), true
}

func (h *Handler) readFile(w http.ResponseWriter, r *http.Request, b *boxState) {
	raw, ok := fileQuery(w, r)
	if !ok {
		return
	}
	p, cerr := fileTarget(raw)
	if cerr != nil {
		writeAPIError(w, http.StatusBadRequest, cerr.Message)
		return
	}
	rc, err := b.sb.Agent().ReadFile(r.Context(), p)
	if err != nil {
		status, msg := fileHTTPError(err)
		writeAPIError(w, status, msg)
		return
	}
	defer rc.Close()
	// Small files get a Content-Length (the SDKs look for "0" to return an
	// empty result); larger ones are streamed.
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(rc, head)
	whole := err == io.EOF || err == io.ErrUnexpectedEOF
	if err != nil && !whole {
		status, msg := fileHTTPError(err)
		writeAPIError(w, status, msg)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if whole {
		w.Header().Set("Content-Length", strconv.Itoa(n))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := w.Write(head[:n]); err != nil || whole {
		return
	}
	if _, err := io.Copy(w, rc); err != nil {
		// The status is sent; cutting the connection tells the client
		// the body is incomplete.
		panic(http.ErrAbortHandler)
	}
}

// errFileTooLarge reports an upload above Config.MaxFileBytes.
var errFileTooLarge = errors.New("file larger than the upload limit")

// cappedReader fails with errFileTooLarge after max bytes.
type cappedReader struct {
	r   io.Reader
	max int64
	n   int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n > c.max {
		return 0, errFileTooLarge
	}
	if rem := c.max + 1 - c.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, fmt.Errorf("%w (%d bytes)", errFileTooLarge, c.max)
	}
	return n, err
}

// uploaded is envd's answer for one written file.
type uploaded struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeaderPrefix marks the request headers that carry a file's
// metadata (envd 0.6.2): X-Metadata-KEY: VALUE.
const metadataHeaderPrefix = "X-Metadata-"

// metadataOf returns the metadata of an upload's X-Metadata-* headers, as
// envd reads them: the prefix stripped, the key lower-cased, the first
// value of a repeated header.
func metadataOf(h http.Header) map[string]string {
	var md map[string]string
	for name, values := range h {
		key, ok := strings.CutPrefix(name, metadataHeaderPrefix)
		if !ok || key == "" || len(values) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(key)] = values[0]
	}
	return md
}

// partFileName returns a multipart part's file name as sent: Go's
// Part.FileName keeps only the base name, but envd's clients put the whole
// path there. Form encoders escape '"', CR and LF as %22, %0D and %0A.
func partFileName(h map[string][]string) string {
	cd := ""
	if v := h["Content-Disposition"]; len(v) > 0 {
		cd = v[0]
	}
	_, params, err := mime.ParseMediaType(cd)
	if err != nil {
		return ""
	}
	return strings.NewReplacer("%22", `"`, "%0D", "\r", "%0A", "\n").Replace(params["filename"])
}

func (h *Handler) writeFiles(w http.ResponseWriter, r *http.Request, b *boxState) {
	qpath, ok := fileQuery(w, r)
	if !ok {
		return
	}
	md := metadataOf(r.Header)
	if err := agent.CheckMetadata(md); err != nil {
		writeAPIError(w, http.StatusBadRequest, err.Error())
		return
	}
	max := h.cfg.MaxFileBytes
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploaded
	write := func(target string, body io.Reader) bool {
		p, cerr := fileTarget(target)
		if cerr != nil {
			writeAPIError(w, http.StatusBadRequest, cerr.Message)
			return false
		}
		for _, u := range out {
			// As envd: one upload writes each path once. Several parts
			// with the path parameter would all land on it.
			if u.Path == fromSandbox(p) {
				writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("you cannot upload multiple files to the same path %q in one upload request; only the first was written (name each file in its part's file name, without the path parameter)", fromSandbox(p)))
				return false
			}
		}
		ag := b.sb.Agent()
		if err := h.m.AuditFirst(r.Context(), b.sb.Owner(), b.sb.ID, store.ActionFileWrite, map[string]any{"path": p, "via": "e2b"}); err != nil {
			status := http.StatusServiceUnavailable
			if errors.Is(err, store.ErrNoSpace) {
				status = http.StatusInsufficientStorage
			}
			writeAPIError(w, status, err.Error())
			return false
		}
		mark := b.markWatchers(p)
		// As envd, every upload replaces the file's metadata with the
		// request's (none clears it).
		n, err := ag.WriteFileMetadata(r.Context(), p, &cappedReader{r: body, max: max}, md)
		if err == nil {
			mark.settle(r.Context(), p, n == 0)
		}
		detail := map[string]any{"path": p, "bytes": n, "via": "e2b"}
		if err != nil {
			detail["error"] = err.Error()
		}
		h.m.Audit(r.Context(), b.sb.Owner(), b.sb.ID, store.ActionFileWrite+".result", detail)
		if err != nil {
			if errors.Is(err, errFileTooLarge) {
				ag.Remove(r.Context(), p) // do not leave a partial file
			}
			status, msg := fileHTTPError(err)
			writeAPIError(w, status, msg)
			return false
		}
		out = append(out, uploaded{Name: path.Base(p), Type: "file", Path: fromSandbox(p), Metadata: md})
		return true
	}
	switch mt {
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			writeAPIError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeAPIError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := qpath
			if target == "" {
				target = partFileName(part.Header)
			}
			if target == "" {
				writeAPIError(w, http.StatusBadRequest, "no path: give the path parameter or the part's file name")
				return
			}
			ok := write(target, part)
			part.Close()
			if !ok {
				return
			}
		}
		if len(out) == 0 {
			writeAPIError(w, http.StatusBadRequest, `no file: send multipart parts named "file"`)
			return
		}
	case "application/octet-stream":
		if qpath == "" {
			writeAPIError(w, http.StatusBadRequest, "missing path parameter")
			return
		}
		var body io.Reader = r.Body
		switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				writeAPIError(w, http.StatusBadRequest, "bad gzip body: "+err.Error())
				return
			}
			defer zr.Close()
			body = zr
		default:
			writeAPIError(w, http.StatusUnsupportedMediaType, "unsupported Content-Encoding "+strconv.Quote(enc))
			return
		}
		if !write(qpath, body) {
			return
		}
	default:
		writeAPIError(w, http.StatusBadRequest, "Content-Type must be multipart/form-data or application/octet-stream")
		return
	}
	writeJSON(w, http.StatusOK, out)
}
