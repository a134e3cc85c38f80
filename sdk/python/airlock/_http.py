"""HTTP transport of the airlock SDK: the standard library only."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any


class AirlockError(Exception):
    """An error answer of the server, or a failure to reach it.

    status is the HTTP status (0 when the server could not be reached),
    code the machine-readable code ("not_found", "paused", ...).
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"airlock: {status} {code}: {message}" if status else f"airlock: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass
class SSEEvent:
    """One Server-Sent Event: its type and its JSON data."""

    type: str
    data: dict[str, Any]


def _error_of(status: int, body: bytes) -> AirlockError:
    try:
        err = json.loads(body)["error"]
        return AirlockError(status, str(err["code"]), str(err["message"]))
    except (ValueError, KeyError, TypeError):
        return AirlockError(status, "http_error", body[:2048].decode("utf-8", "replace").strip())


class Transport:
    """Sends requests to one server; one connection per request."""

    def __init__(self, url: str, api_key: str | None, timeout: float | None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
            raise ValueError(f"server URL {url!r}: want http://HOST:PORT or https://HOST:PORT")
        if "@" in parsed.netloc:
            raise ValueError("put the API key in api_key or $AIRLOCK_API_KEY, not in the URL")
        if api_key is not None and ("\r" in api_key or "\n" in api_key):
            raise ValueError("the API key holds a line break")
        self.base = url.rstrip("/")
        self.api_key = api_key or None
        self.timeout = timeout

    def url(self, path: str, query: dict[str, Any] | None = None) -> str:
        u = self.base + path
        if query:
            items = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items() if v is not None]
            if items:
                u += "?" + urllib.parse.urlencode(items)
        return u

    def open(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        json_body: Any = None,
        body: bytes | IO[bytes] | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Sends a request; returns the open response of a 2xx answer."""
        data: bytes | IO[bytes] | None = body
        headers = {"User-Agent": "airlock-python"}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        req = urllib.request.Request(self.url(path, query), data=data, method=method, headers=headers)
        if data is not None and not isinstance(data, bytes):
            # A file streams in chunks (no Content-Length to know up front).
            req.add_header("Transfer-Encoding", "chunked")
        try:
            return urllib.request.urlopen(req, timeout=timeout if timeout is not None else self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                raise _error_of(e.code, e.read(1 << 20)) from None
        except urllib.error.URLError as e:
            raise AirlockError(0, "unreachable", f"{method} {path}: {e.reason} (is airlock serve running at {self.base}?)") from None
        except (TimeoutError, socket.timeout) as e:
            raise AirlockError(0, "timeout", f"{method} {path}: {e}") from None

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None, json_body: Any = None,
             timeout: float | None = None) -> Any:
        """Sends a JSON request and decodes the JSON answer (None when empty)."""
        with self.open(method, path, query=query, json_body=json_body, timeout=timeout) as resp:
            raw = resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise AirlockError(resp.status, "bad_response", f"{method} {path}: not JSON: {e}") from None


def iter_sse(resp: Any) -> Iterator[SSEEvent]:
    """Yields the events of an event-stream response, then closes it."""
    with resp:
        typ = ""
        data: list[str] = []
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if typ:
                    payload = json.loads("".join(data)) if data else {}
                    yield SSEEvent(typ, payload if isinstance(payload, dict) else {"value": payload})
                typ, data = "", []
            elif line.startswith("event: "):
                typ = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])


def output_bytes(data: dict[str, Any]) -> bytes:
    """The bytes of a stdout/stderr event: data, or data_b64 when not UTF-8."""
    if data.get("data_b64"):
        return base64.b64decode(data["data_b64"])
    return str(data.get("data", "")).encode()
