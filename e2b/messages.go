package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The messages of envd's process.Process and filesystem.Filesystem services
// in the protobuf JSON mapping, defined here from E2B's public protocol
// definitions (the JSON names are the wire contract): camelCase names,
// 64-bit integers as strings, bytes as base64, enums by name, Timestamps
// as RFC 3339, oneofs as whichever member is present, default values
// omitted. Decoding accepts what protobuf's JSON parsers accept: numbers as
// numbers or strings, enums by name or number, the original snake_case
// field names, and base64 with or without padding, standard or URL-safe.

// pbBytes is a protobuf bytes field.
type pbBytes []byte

// MarshalJSON encodes standard base64 with padding.
func (b pbBytes) MarshalJSON() ([]byte, error) {
	return json.Marshal(base64.StdEncoding.EncodeToString(b))
}

// UnmarshalJSON accepts standard or URL-safe base64, padded or not.
func (b *pbBytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return errors.New("bytes field: want a base64 string")
	}
	s = strings.TrimRight(s, "=")
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.RawURLEncoding
	}
	out, err := enc.DecodeString(s)
	if err != nil {
		return fmt.Errorf("bytes field: %v", err)
	}
	*b = out
	return nil
}

// pbUint32 is a protobuf uint32 field: a JSON number, or a string holding
// one.
type pbUint32 uint32

// UnmarshalJSON accepts an integral number or numeric string in range.
func (u *pbUint32) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*u = 0
		return nil
	}
	n, err := parseInt(data, 0, math.MaxUint32)
	if err != nil {
		return fmt.Errorf("uint32 field: %v", err)
	}
	*u = pbUint32(n)
	return nil
}

// pbInt64 is a protobuf int64 field, encoded as a JSON string.
type pbInt64 int64

// MarshalJSON encodes a decimal string.
func (i pbInt64) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(i), 10) + `"`), nil
}

// UnmarshalJSON accepts an integral number or numeric string.
func (i *pbInt64) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*i = 0
		return nil
	}
	n, err := parseInt(data, math.MinInt64, math.MaxInt64)
	if err != nil {
		return fmt.Errorf("int64 field: %v", err)
	}
	*i = pbInt64(n)
	return nil
}

// parseInt parses a protobuf JSON integer (number or string) in [lo, hi].
func parseInt(data []byte, lo, hi int64) (int64, error) {
	s := string(bytes.TrimSpace(data))
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(data, &s); err != nil {
			return 0, err
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Protobuf JSON also allows an integral value in exponent form.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || f < -9.2e18 || f > 9.2e18 {
			return 0, fmt.Errorf("%q is not an integer", s)
		}
		n = int64(f)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%d out of range", n)
	}
	return n, nil
}

// pbTime is a google.protobuf.Timestamp.
type pbTime time.Time

// MarshalJSON encodes RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
func (t pbTime) MarshalJSON() ([]byte, error) {
	tt := time.Time(t).UTC()
	layout := "2006-01-02T15:04:05"
	switch ns := tt.Nanosecond(); {
	case ns == 0:
	case ns%1e6 == 0:
		layout += ".000"
	case ns%1e3 == 0:
		layout += ".000000"
	default:
		layout += ".000000000"
	}
	return []byte(`"` + tt.Format(layout) + `Z"`), nil
}

// enumValue decodes a protobuf enum given by name or number.
func enumValue(data []byte, names map[string]int32) (int32, error) {
	if string(data) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(data, &s) == nil {
		if v, ok := names[s]; ok {
			return v, nil
		}
		return 0, fmt.Errorf("unknown enum value %q", s)
	}
	n, err := parseInt(data, math.MinInt32, math.MaxInt32)
	if err != nil {
		return 0, fmt.Errorf("enum: %v", err)
	}
	return int32(n), nil
}

// --- process.Process -------------------------------------------------------

// processConfig is process.ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd,omitempty"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// ptySize is process.PTY.Size.
type ptySize struct {
	Cols pbUint32 `json:"cols,omitempty"`
	Rows pbUint32 `json:"rows,omitempty"`
}

// updateRequest is process.UpdateRequest: a terminal's new size.
type updateRequest struct {
	Process *processSelector `json:"process,omitempty"`
	Pty     *ptyConfig       `json:"pty,omitempty"`
}

// ptyConfig is process.PTY.
type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

// startRequest is process.StartRequest.
type startRequest struct {
	Process *processConfig `json:"process,omitempty"`
	Pty     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

// processSelector is process.ProcessSelector (a oneof of pid and tag).
type processSelector struct {
	Pid *pbUint32 `json:"pid,omitempty"`
	Tag *string   `json:"tag,omitempty"`
}

// connectRequest is process.ConnectRequest.
type connectRequest struct {
	Process *processSelector `json:"process,omitempty"`
}

// startEvent is process.ProcessEvent.StartEvent.
type startEvent struct {
	Pid uint32 `json:"pid"`
}

// dataEvent is process.ProcessEvent.DataEvent (a oneof of its fields).
type dataEvent struct {
	Stdout pbBytes `json:"stdout,omitempty"`
	Stderr pbBytes `json:"stderr,omitempty"`
	Pty    pbBytes `json:"pty,omitempty"`
}

// endEvent is process.ProcessEvent.EndEvent.
type endEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// empty is an empty message, present (as {}) when its pointer is non-nil.
type empty struct{}

// processEvent is process.ProcessEvent (a oneof of its fields).
type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

// eventResponse is process.StartResponse and process.ConnectResponse.
type eventResponse struct {
	Event *processEvent `json:"event,omitempty"`
}

// processInfo is process.ProcessInfo.
type processInfo struct {
	Config *processConfig `json:"config,omitempty"`
	Pid    uint32         `json:"pid,omitempty"`
	Tag    *string        `json:"tag,omitempty"`
}

// listResponse is process.ListResponse.
type listResponse struct {
	Processes []processInfo `json:"processes,omitempty"`
}

// processInput is process.ProcessInput (a oneof of stdin and pty).
type processInput struct {
	Stdin *pbBytes `json:"stdin,omitempty"`
	Pty   *pbBytes `json:"pty,omitempty"`
}

// sendInputRequest is process.SendInputRequest.
type sendInputRequest struct {
	Process *processSelector `json:"process,omitempty"`
	Input   *processInput    `json:"input,omitempty"`
}

// Signals of process.Signal.
const (
	signalUnspecified int32 = 0
	signalSIGKILL     int32 = 9
	signalSIGTERM     int32 = 15
)

var signalNamesPB = map[string]int32{
	"SIGNAL_UNSPECIFIED": signalUnspecified, "SIGNAL_SIGKILL": signalSIGKILL, "SIGNAL_SIGTERM": signalSIGTERM,
}

// pbSignal is the process.Signal enum.
type pbSignal int32

// UnmarshalJSON accepts the enum's name or number.
func (s *pbSignal) UnmarshalJSON(data []byte) error {
	v, err := enumValue(data, signalNamesPB)
	*s = pbSignal(v)
	return err
}

// sendSignalRequest is process.SendSignalRequest.
type sendSignalRequest struct {
	Process *processSelector `json:"process,omitempty"`
	Signal  pbSignal         `json:"signal,omitempty"`
}

// closeStdinRequest is process.CloseStdinRequest.
type closeStdinRequest struct {
	Process *processSelector `json:"process,omitempty"`
}

// --- filesystem.Filesystem ---------------------------------------------------

// File types of filesystem.FileType.
const (
	fileTypeUnspecified int32 = 0
	fileTypeFile        int32 = 1
	fileTypeDirectory   int32 = 2
	fileTypeSymlink     int32 = 3
)

// pbFileType is the filesystem.FileType enum, encoded by name.
type pbFileType int32

// MarshalJSON encodes the enum's name.
func (t pbFileType) MarshalJSON() ([]byte, error) {
	switch int32(t) {
	case fileTypeFile:
		return []byte(`"FILE_TYPE_FILE"`), nil
	case fileTypeDirectory:
		return []byte(`"FILE_TYPE_DIRECTORY"`), nil
	case fileTypeSymlink:
		return []byte(`"FILE_TYPE_SYMLINK"`), nil
	}
	return []byte(`"FILE_TYPE_UNSPECIFIED"`), nil
}

// Event types of filesystem.EventType.
const (
	eventCreate int32 = 1
	eventWrite  int32 = 2
	eventRemove int32 = 3
	eventRename int32 = 4
	eventChmod  int32 = 5
)

// pbEventType is the filesystem.EventType enum, encoded by name.
type pbEventType int32

// MarshalJSON encodes the enum's name.
func (t pbEventType) MarshalJSON() ([]byte, error) {
	names := map[int32]string{eventCreate: "EVENT_TYPE_CREATE", eventWrite: "EVENT_TYPE_WRITE",
		eventRemove: "EVENT_TYPE_REMOVE", eventRename: "EVENT_TYPE_RENAME", eventChmod: "EVENT_TYPE_CHMOD"}
	if n, ok := names[int32(t)]; ok {
		return json.Marshal(n)
	}
	return []byte(`"EVENT_TYPE_UNSPECIFIED"`), nil
}

// entryInfo is filesystem.EntryInfo.
type entryInfo struct {
	Name          string     `json:"name,omitempty"`
	Type          pbFileType `json:"type,omitempty"`
	Path          string     `json:"path,omitempty"`
	Size          pbInt64    `json:"size,omitempty"`
	Mode          uint32     `json:"mode,omitempty"`
	Permissions   string     `json:"permissions,omitempty"`
	Owner         string     `json:"owner,omitempty"`
	Group         string     `json:"group,omitempty"`
	ModifiedTime  *pbTime    `json:"modifiedTime,omitempty"`
	SymlinkTarget *string    `json:"symlinkTarget,omitempty"`
	// Metadata is the file's user-defined metadata (envd 0.6.2).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// pathRequest is filesystem.StatRequest, MakeDirRequest and RemoveRequest.
type pathRequest struct {
	Path string `json:"path"`
}

// entryResponse is filesystem.StatResponse, MakeDirResponse and
// MoveResponse.
type entryResponse struct {
	Entry *entryInfo `json:"entry,omitempty"`
}

// listDirRequest is filesystem.ListDirRequest.
type listDirRequest struct {
	Path  string   `json:"path"`
	Depth pbUint32 `json:"depth"`
}

// listDirResponse is filesystem.ListDirResponse.
type listDirResponse struct {
	Entries []entryInfo `json:"entries,omitempty"`
}

// moveRequest is filesystem.MoveRequest.
type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// watchRequest is filesystem.WatchDirRequest and CreateWatcherRequest.
type watchRequest struct {
	Path               string
	Recursive          bool
	IncludeEntry       bool
	AllowNetworkMounts bool
}

// UnmarshalJSON accepts the camelCase and the snake_case field names.
func (w *watchRequest) UnmarshalJSON(data []byte) error {
	var m struct {
		Path         string `json:"path"`
		Recursive    bool   `json:"recursive"`
		IncludeEntry *bool  `json:"includeEntry"`
		IncludeSnake *bool  `json:"include_entry"`
		AllowNet     *bool  `json:"allowNetworkMounts"`
		AllowSnake   *bool  `json:"allow_network_mounts"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*w = watchRequest{Path: m.Path, Recursive: m.Recursive}
	for _, b := range []*bool{m.IncludeEntry, m.IncludeSnake} {
		if b != nil {
			w.IncludeEntry = *b
		}
	}
	for _, b := range []*bool{m.AllowNet, m.AllowSnake} {
		if b != nil {
			w.AllowNetworkMounts = *b
		}
	}
	return nil
}

// filesystemEvent is filesystem.FilesystemEvent.
type filesystemEvent struct {
	Name  string      `json:"name,omitempty"`
	Type  pbEventType `json:"type,omitempty"`
	Entry *entryInfo  `json:"entry,omitempty"`
}

// watchDirResponse is filesystem.WatchDirResponse (a oneof of its fields).
type watchDirResponse struct {
	Start      *empty           `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *empty           `json:"keepalive,omitempty"`
}

// watcherIDRequest is filesystem.GetWatcherEventsRequest and
// RemoveWatcherRequest.
type watcherIDRequest struct {
	WatcherID string
}

// UnmarshalJSON accepts watcherId and watcher_id.
func (w *watcherIDRequest) UnmarshalJSON(data []byte) error {
	var m struct {
		Camel *string `json:"watcherId"`
		Snake *string `json:"watcher_id"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	for _, s := range []*string{m.Camel, m.Snake} {
		if s != nil {
			w.WatcherID = *s
		}
	}
	return nil
}

// createWatcherResponse is filesystem.CreateWatcherResponse.
type createWatcherResponse struct {
	WatcherID string `json:"watcherId,omitempty"`
}

// getWatcherEventsResponse is filesystem.GetWatcherEventsResponse.
type getWatcherEventsResponse struct {
	Events []filesystemEvent `json:"events,omitempty"`
}
