"""The airlock client: sandboxes, commands, files, code, images, volumes."""

from __future__ import annotations

import base64
import os
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, Any

from ._http import AirlockError, Transport, iter_sse, output_bytes
from .types import (CodeContext, CodeError, CodeEvent, CodeResult, ExecEvent, ExecResult, FileInfo, Image, Info,
                    Layer, Limits, MemorySnapshot, Process, TemplateResult, Volume)

#: Environment variables Airlock() reads when not given arguments.
ENV_URL = "AIRLOCK_URL"
ENV_API_KEY = "AIRLOCK_API_KEY"
ENV_TIMEOUT = "AIRLOCK_TIMEOUT"


# The classes below have methods named list: annotations use _list.
_list = list


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _env_timeout() -> float | None:
    v = os.environ.get(ENV_TIMEOUT, "")
    if not v:
        return None
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if v.endswith(suffix):
            try:
                n = float(v[: -len(suffix)]) * units[suffix]
            except ValueError:
                break
            if n > 0:
                return n
            break
    raise ValueError(f"${ENV_TIMEOUT}={v!r}: want a duration such as 30s or 5m")


class Airlock:
    """A client of one airlock server.

    Without arguments it reads $AIRLOCK_URL (required), $AIRLOCK_API_KEY and
    $AIRLOCK_TIMEOUT ("30s", "5m": a limit on each request, none by
    default); arguments win over the environment. Every duration is in
    seconds.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float | None = None) -> None:
        url = url or os.environ.get(ENV_URL, "")
        if not url:
            raise ValueError(f"no server URL: pass url= or set ${ENV_URL} (e.g. http://127.0.0.1:7070)")
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY) or None
        if timeout is None:
            timeout = _env_timeout()
        self._t = Transport(url, api_key, timeout)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._t.base

    def info(self) -> Info:
        """The server's version, runtimes and enforced isolation."""
        return Info.from_json(self._t.call("GET", "/v1/info"))

    # Sandboxes.

    def create(
        self,
        *,
        image: str | None = None,
        profile: str | None = None,
        runtime: str | None = None,
        ttl: float | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        network: Mapping[str, Any] | None = None,
        volumes: Mapping[str, str] | None = None,
        user: str | None = None,
        snapshot: str | None = None,
    ) -> Sandbox:
        """Creates a sandbox. ttl is its lifetime in seconds (None: the
        server's default); volumes maps a volume's name to its path;
        network is {"mode": "none"|"allowlist"|"open", "allow": [...]};
        snapshot forks a gvisor sandbox from a MemorySnapshot's id. Use it
        as a context manager to kill it at the end."""
        body: dict[str, Any] = {}
        for k, v in (("image", image), ("profile", profile), ("runtime", runtime), ("user", user), ("snapshot", snapshot)):
            if v:
                body[k] = v
        if ttl is not None:
            if ttl <= 0:
                raise ValueError("ttl must be positive seconds")
            body["timeout"] = ttl
        if env:
            body["env"] = dict(env)
        if metadata:
            body["metadata"] = dict(metadata)
        if limits is not None:
            body["limits"] = limits.to_json()
        if network is not None:
            body["network"] = dict(network)
        if volumes:
            body["volumes"] = [{"name": n, "path": p} for n, p in volumes.items()]
        return Sandbox(self, self._t.call("POST", "/v1/sandboxes", json_body=body))

    def get(self, sandbox_id: str) -> Sandbox:
        """A sandbox by id (ended ones too)."""
        return Sandbox(self, self._t.call("GET", f"/v1/sandboxes/{_q(sandbox_id)}"))

    def list(self, *, metadata: Mapping[str, str] | None = None, states: Sequence[str] | None = None) -> _list[Sandbox]:
        """Your sandboxes with all of the metadata labels; states filters
        (running, exited, killed, expired, lost; default running)."""
        query: dict[str, Any] = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        if states:
            query["state"] = ",".join(states)
        out: list[Sandbox] = []
        while True:
            page = self._t.call("GET", "/v1/sandboxes", query=query)
            sbs = page.get("sandboxes") or []
            out.extend(Sandbox(self, d) for d in sbs)
            if not page.get("next") or not sbs:
                return out
            query["after"] = page["next"]

    # Images, templates, volumes.

    def images(self) -> _list[Image]:
        """The images your key may use: its own and the public ones."""
        return [Image.from_json(d) for d in self._t.call("GET", "/v1/images").get("images") or []]

    def image(self, ref: str) -> Image:
        """Inspects an image by name, digest or digest prefix."""
        return Image.from_json(self._t.call("GET", "/v1/images/" + "/".join(_q(p) for p in ref.split("/"))))

    def pull_image(self, ref: str, platform: str | None = None) -> Image:
        """Pulls ref from a registry on the server's allowlist."""
        body = {"ref": ref}
        if platform:
            body["platform"] = platform
        return Image.from_json(self._t.call("POST", "/v1/images", json_body=body))

    def remove_image(self, ref: str) -> Image:
        """Removes one of your images."""
        return Image.from_json(self._t.call("DELETE", "/v1/images/" + "/".join(_q(p) for p in ref.split("/"))))

    def build_template(
        self,
        name: str,
        dockerfile: str,
        files: Mapping[str, bytes | str] | None = None,
        *,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        runtime: str | None = None,
    ) -> TemplateResult:
        """Builds an image from a Dockerfile and its context files (the
        request is at most 1 MiB); a failed step raises AirlockError with
        code build_failed and the log in its message."""
        body: dict[str, Any] = {"name": name, "dockerfile": dockerfile}
        if files:
            body["files"] = {p: base64.b64encode(c.encode() if isinstance(c, str) else c).decode() for p, c in files.items()}
        if build_args:
            body["build_args"] = dict(build_args)
        if no_cache:
            body["no_cache"] = True
        if runtime:
            body["runtime"] = runtime
        return TemplateResult.from_json(self._t.call("POST", "/v1/templates", json_body=body))

    def volumes(self) -> _list[Volume]:
        """Your volumes."""
        return [Volume.from_json(d) for d in self._t.call("GET", "/v1/volumes").get("volumes") or []]

    def create_volume(self, name: str, size_bytes: int) -> Volume:
        """Creates a volume (4 MiB to 1 TiB) that outlives sandboxes."""
        return Volume.from_json(self._t.call("POST", "/v1/volumes", json_body={"name": name, "size_bytes": size_bytes}))

    def delete_volume(self, name: str) -> Volume:
        """Deletes a volume and its data (409 while a live sandbox mounts it)."""
        return Volume.from_json(self._t.call("DELETE", f"/v1/volumes/{_q(name)}"))


class Sandbox:
    """A sandbox of the server. Its fields are as of the last answer
    about it (refresh() asks again)."""

    id: str
    state: str
    profile: str
    runtime: str
    paused: bool
    metadata: dict[str, str]
    created_at: datetime | None
    expires_at: datetime | None
    end_reason: str
    enforced: list[Layer]

    def __init__(self, client: Airlock, d: dict[str, Any]) -> None:
        self._c = client
        self._t = client._t
        self._update(d)
        self.files = Files(self)

    def _update(self, d: dict[str, Any]) -> None:
        from .types import _time

        self.id = d["id"]
        self.state = d.get("state", "")
        self.profile = d.get("profile", "")
        self.runtime = d.get("runtime", "")
        self.paused = bool(d.get("paused"))
        self.metadata = dict(d.get("metadata") or {})
        self.created_at = _time(d.get("created_at"))
        self.expires_at = _time(d.get("expires_at"))
        self.end_reason = d.get("end_reason", "")
        self.enforced = [Layer.from_json(x) for x in d.get("enforced") or []]

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.state!r}, runtime={self.runtime!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{_q(self.id)}{rest}"

    def refresh(self) -> Sandbox:
        """Reads the sandbox's state again."""
        self._update(self._t.call("GET", self._path()))
        return self

    def kill(self) -> None:
        """Kills the sandbox (idempotent)."""
        d = self._t.call("DELETE", self._path())
        if d:
            self._update(d)

    def set_ttl(self, seconds: float) -> None:
        """Makes the sandbox expire seconds from now."""
        self._update(self._t.call("POST", self._path("/timeout"), json_body={"timeout": seconds}))

    def pause(self) -> None:
        """Stops every process until resume(); the TTL counts on."""
        self._update(self._t.call("POST", self._path("/pause")))

    def resume(self) -> None:
        """Resumes a paused sandbox."""
        self._update(self._t.call("POST", self._path("/resume")))

    def snapshot(self) -> MemorySnapshot:
        """Snapshots a running gvisor sandbox's whole state without
        stopping it; Airlock.create(snapshot=snap.id) forks it."""
        return MemorySnapshot.from_json(self._t.call("POST", self._path("/snapshots")))

    def snapshot_image(self, name: str | None = None) -> Image:
        """Makes an image of a sandbox created from an image, with what it
        changed in its root."""
        return Image.from_json(self._t.call("POST", self._path("/snapshot"), json_body={"name": name} if name else {}))

    def metrics(self) -> dict[str, Any]:
        """Resource use now: cpu_seconds, memory_bytes, pids, ..."""
        return dict(self._t.call("GET", self._path("/metrics")))

    # Commands.

    @staticmethod
    def _exec_body(cmd: str | Sequence[str], cwd: str | None, env: Mapping[str, str] | None, stdin: str | None,
                   timeout: float | None, max_output: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"shell": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
        if isinstance(cmd, str) and not cmd or not isinstance(cmd, str) and not body["argv"]:
            raise ValueError("empty command")
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if stdin is not None:
            body["stdin"] = stdin
        if timeout is not None:
            if timeout <= 0:
                raise ValueError("timeout must be positive seconds")
            body["timeout"] = timeout
        if max_output is not None:
            body["max_output"] = max_output
        return body

    def _request_timeout(self, timeout: float | None) -> float | None:
        # The connection must outlast the command's own limit.
        if self._t.timeout is None:
            return None
        return max(self._t.timeout, (timeout or 60.0) + 30.0)

    def exec(self, cmd: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
             stdin: str | None = None, timeout: float | None = None, max_output: int | None = None) -> ExecResult:
        """Runs a command to its end: a string runs under /bin/sh -c, a
        list is the argv. timeout (seconds, default 60) kills it."""
        body = self._exec_body(cmd, cwd, env, stdin, timeout, max_output)
        return ExecResult.from_json(self._t.call("POST", self._path("/exec"), json_body=body,
                                                 timeout=self._request_timeout(timeout)))

    def exec_stream(self, cmd: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                    stdin: str | None = None, timeout: float | None = None,
                    max_output: int | None = None) -> Iterator[ExecEvent]:
        """Runs a command and yields its events as they come: start,
        stdout and stderr (bytes), then exit. Leaving the loop early kills
        the command."""
        body = self._exec_body(cmd, cwd, env, stdin, timeout, max_output)
        resp = self._t.open("POST", self._path("/exec"), json_body=body, accept="text/event-stream",
                            timeout=self._request_timeout(timeout))
        if resp.headers.get_content_type() == "application/json":
            # A command that never started (not found, not executable)
            # is answered whole.
            import json

            with resp:
                r = ExecResult.from_json(json.loads(resp.read()))
            if r.stdout:
                yield ExecEvent("stdout", r.stdout.encode())
            if r.stderr:
                yield ExecEvent("stderr", r.stderr.encode())
            yield ExecEvent("exit", pid=r.pid, exit_code=r.exit_code, signal=r.signal, status=r.status)
            return
        yield from _exec_events(iter_sse(resp))

    def start(self, cmd: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              tag: str | None = None) -> int:
        """Starts a background command and returns its pid at once."""
        body = self._exec_body(cmd, cwd, env, None, None, None)
        body["background"] = True
        if tag:
            body["tag"] = tag
        return int(self._t.call("POST", self._path("/exec"), json_body=body)["pid"])

    def attach(self, pid: int) -> Iterator[ExecEvent]:
        """Yields a process's output so far, then live, then its exit;
        leaving the loop only detaches."""
        resp = self._t.open("GET", self._path(f"/processes/{int(pid)}/events"), accept="text/event-stream", timeout=None)
        yield from _exec_events(iter_sse(resp))

    def processes(self) -> _list[Process]:
        """The sandbox's processes."""
        return [Process.from_json(d) for d in self._t.call("GET", self._path("/processes")).get("processes") or []]

    def signal(self, pid: int, sig: str = "TERM") -> None:
        """Sends a signal (TERM, KILL, INT, ...) to a process's group."""
        self._t.call("POST", self._path(f"/processes/{int(pid)}/signal"), json_body={"signal": sig})

    # Code.

    def create_context(self, language: str = "python", *, cwd: str | None = None,
                       env: Mapping[str, str] | None = None) -> CodeContext:
        """Starts a persistent interpreter: python, javascript, typescript or bash."""
        body: dict[str, Any] = {"language": language}
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        return CodeContext.from_json(self._t.call("POST", self._path("/contexts"), json_body=body))

    def contexts(self) -> _list[CodeContext]:
        """The sandbox's interpreter contexts."""
        return [CodeContext.from_json(d) for d in self._t.call("GET", self._path("/contexts")).get("contexts") or []]

    def restart_context(self, context: CodeContext | str) -> None:
        """Replaces a context's interpreter with a fresh one (state is lost)."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._t.call("POST", self._path(f"/contexts/{_q(cid)}/restart"), json_body={})

    def delete_context(self, context: CodeContext | str) -> None:
        """Stops a context."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._t.call("DELETE", self._path(f"/contexts/{_q(cid)}"))

    @staticmethod
    def _code_body(code: str, context: CodeContext | str | None, language: str | None, timeout: float | None,
                   env: Mapping[str, str] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"code": code}
        if context is not None:
            body["context_id"] = context.id if isinstance(context, CodeContext) else context
        if language:
            body["language"] = language
        if timeout is not None:
            if timeout <= 0:
                raise ValueError("timeout must be positive seconds")
            body["timeout"] = timeout
        if env:
            body["env"] = dict(env)
        return body

    def run_code(self, code: str, *, context: CodeContext | str | None = None, language: str | None = None,
                 timeout: float | None = None, env: Mapping[str, str] | None = None) -> CodeResult:
        """Runs a cell in a context (default: the language's default
        context) and returns its outcome; a raised exception is in
        .error, not raised here."""
        body = self._code_body(code, context, language, timeout, env)
        return CodeResult.from_json(self._t.call("POST", self._path("/code"), json_body=body,
                                                 timeout=self._request_timeout(timeout)))

    def run_code_stream(self, code: str, *, context: CodeContext | str | None = None, language: str | None = None,
                        timeout: float | None = None, env: Mapping[str, str] | None = None) -> Iterator[CodeEvent]:
        """Runs a cell and yields its events as they come; leaving the
        loop early interrupts the cell."""
        body = self._code_body(code, context, language, timeout, env)
        resp = self._t.open("POST", self._path("/code"), json_body=body, accept="text/event-stream",
                            timeout=self._request_timeout(timeout))
        for ev in iter_sse(resp):
            d = ev.data
            match ev.type:
                case "start":
                    yield CodeEvent("start", execution_id=d.get("execution_id", ""))
                case "stdout" | "stderr":
                    yield CodeEvent(ev.type, text=output_bytes(d).decode("utf-8", "replace"))
                case "result":
                    yield CodeEvent("result", data=dict(d.get("data") or {}), main=bool(d.get("main")))
                case "error":
                    yield CodeEvent("error", error=CodeError.from_json(d))
                case "end":
                    end = CodeResult.from_json(d)
                    yield CodeEvent("end", execution_id=end.execution_id, error=end.error, end=end)

    def interrupt_code(self, execution_id: str) -> None:
        """Interrupts a running cell (it ends with KeyboardInterrupt)."""
        self._t.call("DELETE", self._path(f"/code/{_q(execution_id)}"))


def _exec_events(events: Iterator[Any]) -> Iterator[ExecEvent]:
    for ev in events:
        d = ev.data
        match ev.type:
            case "start":
                yield ExecEvent("start", pid=int(d.get("pid", 0)))
            case "stdout" | "stderr":
                yield ExecEvent(ev.type, output_bytes(d))
            case "exit":
                yield ExecEvent("exit", pid=int(d.get("pid", 0)), exit_code=int(d.get("exit_code", 0)),
                                signal=d.get("signal", ""), status=d.get("status", ""))
            case "error":
                yield ExecEvent("error", str(d.get("message", "")).encode())


class Files:
    """The files of a sandbox (paths under /workspace and /tmp)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox
        self._t = sandbox._t

    def read(self, path: str) -> bytes:
        """A regular file's bytes."""
        with self._t.open("GET", self._sb._path("/files"), query={"path": path}) as resp:
            return bytes(resp.read())

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A regular file's text."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: bytes | str | IO[bytes], *, mode: int | None = None) -> int:
        """Writes a file (bytes, text, or a binary file object streamed in
        chunks) and returns the bytes written; mode is e.g. 0o755."""
        body: bytes | IO[bytes] = data.encode() if isinstance(data, str) else data
        query: dict[str, Any] = {"path": path}
        if mode is not None:
            query["mode"] = format(mode, "o")
        with self._t.open("PUT", self._sb._path("/files"), query=query, body=body,
                          content_type="application/octet-stream") as resp:
            import json

            return int(json.loads(resp.read()).get("bytes", 0))

    def list(self, path: str = "/workspace", depth: int = 1) -> _list[FileInfo]:
        """A directory's entries, depth levels deep (1 to 64)."""
        d = self._t.call("GET", self._sb._path("/files/list"), query={"path": path, "depth": depth})
        return [FileInfo.from_json(e) for e in d.get("entries") or []]

    def stat(self, path: str) -> FileInfo:
        """Describes a path without following a final symlink."""
        return FileInfo.from_json(self._t.call("GET", self._sb._path("/files/stat"), query={"path": path}))

    def exists(self, path: str) -> bool:
        """Whether a path exists."""
        try:
            self.stat(path)
            return True
        except AirlockError as e:
            if e.status == 404:
                return False
            raise

    def remove(self, path: str) -> None:
        """Removes a file or a directory tree."""
        self._t.call("DELETE", self._sb._path("/files"), query={"path": path})

    def mkdir(self, path: str) -> None:
        """Makes a directory and its parents."""
        self._t.call("POST", self._sb._path("/files/mkdir"), json_body={"path": path})

    def move(self, src: str, dst: str) -> None:
        """Renames a path."""
        self._t.call("POST", self._sb._path("/files/move"), json_body={"from": src, "to": dst})
