package agent

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// Error codes carried by *Error.
const (
	CodeNotFound         = "not_found"
	CodeExists           = "exists"
	CodeNotADirectory    = "not_a_directory"
	CodeIsADirectory     = "is_a_directory"
	CodeNotRegular       = "not_regular_file" // FIFO, device, socket...
	CodePermissionDenied = "permission_denied"
	CodeInvalidArgument  = "invalid_argument"
	CodeTooLarge         = "too_large"
	CodeNameTooLong      = "name_too_long" // a path component over NAME_MAX
	CodeNoSpace          = "no_space"
	CodeCrossDevice      = "cross_device"
	CodeClosed           = "closed" // stdin already closed, pipe broken
	CodeUnsupported      = "unsupported"
	CodeProtocol         = "protocol_error"
	CodeIO               = "io_error"
	CodeLimit            = "limit_reached" // a process could not start: the sandbox's pids limit is reached
	CodeInternal         = "internal"
	CodeTimeout          = "timeout" // something the agent waited for (a kernel's start) did not happen in time
)

// Error is a structured failure reported by the agent.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error implements error.
func (e *Error) Error() string {
	return "agent: " + e.Code + ": " + e.Message
}

// Is lets errors.Is match an *Error with the same code, and the matching
// io/fs sentinel (fs.ErrNotExist, fs.ErrExist, fs.ErrPermission).
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrExist:
		return e.Code == CodeExists
	case fs.ErrPermission:
		return e.Code == CodePermissionDenied
	}
	return false
}

// Event types.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
)

// Event is one piece of a process's life as seen by a follower: output, or
// its exit (always the last event).
type Event struct {
	// Type is EventStdout, EventStderr or EventExit.
	Type string
	// Data is the output of a stdout or stderr event. The receiver owns it.
	Data []byte
	// ExitCode is the exit code of an exit event; 128+n for a process
	// killed by signal n.
	ExitCode int
	// Signal names the signal that killed the process ("SIGKILL"), if any.
	Signal string
	// Running is set on the exit event ending a Snapshot of a process
	// that has not exited; ExitCode and Signal are then meaningless.
	Running bool
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit code; 128+n when killed by signal n.
	Code int `json:"code"`
	// Signal names the killing signal ("SIGTERM"), empty for a normal exit.
	Signal string `json:"signal,omitempty"`
}

// ExecRequest describes a process to start.
type ExecRequest struct {
	// Argv is the program and its arguments. A program name without a slash
	// is looked up in the PATH of the resulting environment.
	Argv []string
	// Shell is a command line run as /bin/sh -c Shell. Exactly one of Argv
	// and Shell must be set.
	Shell string
	// Cwd is the working directory; relative to the agent's home, which is
	// also the default.
	Cwd string
	// Env is KEY=VALUE pairs added to (or replacing entries of) the
	// sandbox's base environment.
	Env []string
	// Stdin is written to the process's standard input.
	Stdin []byte
	// StdinOpen keeps standard input open after Stdin for later
	// WriteStdin calls; otherwise it is closed after Stdin.
	StdinOpen bool
	// Tag is a free label shown in process listings.
	Tag string
	// Pty, if set, runs the process on a pseudo-terminal of that size: its
	// stdin, stdout and stderr are the terminal, its output arrives as
	// stdout, its input is written as stdin (which stays open), and it
	// leads a session of its own with the terminal as controlling
	// terminal (job control, ^C from the input). Resize with ResizePty.
	Pty *PtySize
	// Background lets the process outlive the stream that started it:
	// closing the Process only detaches. A foreground process is killed
	// (its whole process group) when its Process is closed before it exits.
	Background bool
}

// ProcessInfo describes a process known to the agent: running, or exited and
// still retained (background processes, the most recent ones).
type ProcessInfo struct {
	// Pid is the pid (and process group id) inside the sandbox.
	Pid int `json:"pid"`
	// Argv is the command; /bin/sh -c ... for a shell command. Listings
	// shorten very long argvs.
	Argv []string `json:"argv"`
	// Tag is ExecRequest.Tag.
	Tag string `json:"tag,omitempty"`
	// Cwd is the absolute working directory it started in.
	Cwd string `json:"cwd,omitempty"`
	// Background is ExecRequest.Background.
	Background bool `json:"background,omitempty"`
	// Running is false once the agent has reaped it.
	Running bool `json:"running"`
	// ExitCode and Signal are its exit status once it is not Running.
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// StartedAt and ExitedAt are the agent's clock at start and reaping.
	StartedAt time.Time `json:"started_at"`
	ExitedAt  time.Time `json:"exited_at,omitzero"`
}

// File types of FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// FileInfo describes a path inside the sandbox. Paths are the sandbox's own
// and must never be resolved on the host.
type FileInfo struct {
	// Name is the last element of Path.
	Name string `json:"name"`
	// Path is the absolute path inside the sandbox.
	Path string `json:"path"`
	// Type is TypeFile, TypeDir, TypeSymlink or TypeOther.
	Type string `json:"type"`
	// Size is the size in bytes (of the link itself for a symlink).
	Size int64 `json:"size"`
	// Mode holds the permission bits plus os.ModeSetuid, os.ModeSetgid and
	// os.ModeSticky.
	Mode os.FileMode `json:"mode"`
	// ModTime is the modification time.
	ModTime time.Time `json:"mtime"`
	// Target is a symlink's target, unresolved.
	Target string `json:"target,omitempty"`
	// Owner and Group name the file's owner and group as the sandbox's
	// /etc/passwd and /etc/group do, or give their numeric ids.
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	// Metadata is the file's user-defined metadata (the user.e2b.*
	// extended attributes), if any.
	Metadata map[string]string `json:"metadata,omitempty"`
}
