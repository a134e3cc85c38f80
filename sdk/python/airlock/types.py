"""The API's objects as typed dataclasses (api/openapi.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(v: Any) -> datetime | None:
    if not v:
        return None
    s = str(v)
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    # Go writes nanoseconds; datetime takes microseconds.
    if "." in s:
        head, _, rest = s.partition(".")
        frac = "".join(ch for ch in rest if ch.isdigit())
        tz = rest[len(frac):]
        s = f"{head}.{frac[:6]}{tz}"
    return datetime.fromisoformat(s)


@dataclass
class Layer:
    """One isolation mechanism and its state ("ok", "degraded", ...)."""

    name: str
    state: str
    detail: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Layer:
        return cls(d.get("name", ""), d.get("state", ""), d.get("detail", ""))


@dataclass
class Info:
    """The server: version, runtimes and the isolation it enforces."""

    version: str
    runtimes: list[str]
    default_runtime: str
    auth: bool
    enforced: list[Layer]
    runtime_capabilities: dict[str, dict[str, Any]]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Info:
        return cls(d.get("version", ""), list(d.get("runtimes") or []), d.get("default_runtime", ""),
                   bool(d.get("auth")), [Layer.from_json(x) for x in d.get("enforced") or []],
                   dict(d.get("runtime_capabilities") or {}))


@dataclass
class Limits:
    """Resource overrides for a new sandbox; None keeps the profile's."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ExecResult:
    """The outcome of a command run to its end.

    status is ok, nonzero_exit, killed, oom, timeout, not_found,
    not_executable or error; exit_code is 128+N when signal N killed it.
    """

    pid: int
    exit_code: int
    stdout: str
    stderr: str
    status: str
    signal: str = ""
    truncated: bool = False
    duration_ms: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExecResult:
        return cls(int(d.get("pid", 0)), int(d.get("exit_code", 0)), d.get("stdout", ""), d.get("stderr", ""),
                   d.get("status", ""), d.get("signal", ""), bool(d.get("truncated")), float(d.get("duration_ms", 0)))


@dataclass
class ExecEvent:
    """One event of a streamed command: start (pid), stdout or stderr
    (data), exit (exit_code, signal, status) or error (data: the message)."""

    type: str
    data: bytes = b""
    pid: int = 0
    exit_code: int = 0
    signal: str = ""
    status: str = ""


@dataclass
class Process:
    """A process the sandbox's agent knows."""

    pid: int
    argv: list[str]
    running: bool
    exit_code: int | None
    tag: str = ""
    background: bool = False
    started_at: datetime | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Process:
        return cls(int(d.get("pid", 0)), list(d.get("argv") or []), bool(d.get("running")),
                   d.get("exit_code") if not d.get("running") else None, d.get("tag", ""),
                   bool(d.get("background")), _time(d.get("started_at")))


@dataclass
class FileInfo:
    """A path inside a sandbox; type is file, dir, symlink or other."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: datetime | None
    target: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileInfo:
        return cls(d.get("name", ""), d.get("path", ""), d.get("type", ""), int(d.get("size", 0)),
                   int(d.get("mode", 0)), _time(d.get("mtime")), d.get("target", ""))


@dataclass
class CodeContext:
    """A persistent interpreter (python, javascript, typescript or bash)."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CodeContext:
        return cls(d.get("id", ""), d.get("language", ""), d.get("cwd", ""))


@dataclass
class CodeError:
    """The exception that ended a cell (name is its class)."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> CodeError | None:
        if not d:
            return None
        return cls(d.get("name", ""), d.get("value", ""), list(d.get("traceback") or []))


@dataclass
class CodeResult:
    """A cell's outcome: its output, results (MIME bundles: text/plain,
    image/png in base64, ...), text (the last expression's text/plain)
    and error."""

    execution_id: str
    context_id: str
    execution_count: int
    stdout: str
    stderr: str
    results: list[dict[str, str]]
    text: str
    error: CodeError | None
    truncated: bool = False
    restarted: bool = False
    duration_ms: float = 0.0
    status: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CodeResult:
        return cls(d.get("execution_id", ""), d.get("context_id", ""), int(d.get("execution_count", 0)),
                   d.get("stdout", ""), d.get("stderr", ""), list(d.get("results") or []), d.get("text", ""),
                   CodeError.from_json(d.get("error")), bool(d.get("truncated")), bool(d.get("restarted")),
                   float(d.get("duration_ms", 0)), d.get("status", ""))


@dataclass
class CodeEvent:
    """One event of a streamed cell: start, stdout, stderr (text), result
    (data, main), error (error) or end (end: the outcome without outputs)."""

    type: str
    execution_id: str = ""
    text: str = ""
    data: dict[str, str] = field(default_factory=dict)
    main: bool = False
    error: CodeError | None = None
    end: CodeResult | None = None


@dataclass
class MemorySnapshot:
    """A snapshot of a gvisor sandbox's whole state; create(snapshot=id) forks it."""

    id: str
    sandbox_id: str
    size_bytes: int
    created_at: datetime | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MemorySnapshot:
        return cls(d.get("id", ""), d.get("sandbox_id", ""), int(d.get("size_bytes", 0)), _time(d.get("created_at")))


@dataclass
class Image:
    """An image of the server's store."""

    digest: str
    name: str = ""
    size: int = 0
    created: datetime | None = None
    platform: str = ""
    public: bool = False
    owner: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Image:
        return cls(d.get("digest", ""), d.get("name", ""), int(d.get("size", 0)), _time(d.get("created")),
                   d.get("platform", ""), bool(d.get("public")), d.get("owner", ""), dict(d.get("config") or {}))


@dataclass
class Volume:
    """A named volume of the calling key."""

    name: str
    size_bytes: int
    created_at: datetime | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Volume:
        return cls(d.get("name", ""), int(d.get("size_bytes", 0)), _time(d.get("created_at")))


@dataclass
class TemplateResult:
    """A finished template build: the image, its steps and its log."""

    image: Image | None
    steps: int
    cached: int
    log: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TemplateResult:
        img = d.get("image")
        return cls(Image.from_json(img) if img else None, int(d.get("steps", 0)), int(d.get("cached", 0)), d.get("log", ""))
