"""Local dev server for a site folder written by `webiree build`.

`create_app(root)` returns a Starlette app that serves the files under `root`;
`serve(root)` runs it with uvicorn. It is a static file server and nothing else:

* GET and HEAD only; any other method gets 405 with `Allow: GET, HEAD`.
* `/` and any directory serve that directory's `index.html`, else 404; there
  are no directory listings. A directory requested without its trailing slash
  is redirected (301) to the slash form so that relative URLs in its
  index.html resolve against the directory.
* Content types come from an explicit table (`MIME_TYPES`), not from the
  machine's mimetypes database, which varies between machines; only suffixes
  missing from the table fall back to `mimetypes`, then to
  application/octet-stream.
* Every file response has a strong ETag (inode, size and mtime_ns) and
  `Cache-Control: no-cache`, so a browser revalidates after a rebuild;
  `If-None-Match` answers 304.
* One byte range (`bytes=a-b`, `bytes=a-`, `bytes=-n`) answers 206 with
  Content-Range; an unsatisfiable one answers 416 with `Content-Range:
  bytes */size`. A request with several ranges, a malformed Range header or
  an `If-Range` that does not match the current ETag is answered with the
  whole file (200), as RFC 9110 allows. Every file response carries
  `Accept-Ranges: bytes`.
* Files are streamed in chunks; a range response reads only its slice.
* `isolate=True` adds COOP/COEP/CORP headers to every response, which makes
  the page cross-origin isolated (SharedArrayBuffer, precise timers).

Security rule: a request may only ever read a regular file whose *real* path
(every symlink resolved) lies inside the real path of `root`.

1. The server decodes the URL path once. We go on percent-decoding it until it
   stops changing (so `%252e%252e` counts as `..`) and refuse (403) any path
   whose decoded form holds a NUL byte, a backslash, a `..` segment or a
   segment with a drive or absolute part.
2. The remaining segments are joined onto the root, which makes absolute
   request paths like `//etc/passwd` relative to the root.
3. The joined path is resolved with `os.path.realpath` and must lie inside the
   resolved root, else 403; a symlink that stays inside the root is fine. The
   same check is made again on a directory's `index.html`.
4. The file is opened by its resolved path, and only if it is a regular file.
"""

from __future__ import annotations

from contextlib import contextmanager

import mimetypes
import os
import re
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote, unquote

import anyio
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.endpoints import HTTPEndpoint
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MIME_TYPES", "create_app", "serve"]

# Longest suffix wins, so ".d.ts" is matched before ".ts".
MIME_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".cjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".webmanifest": "application/manifest+json",
    ".wasm": "application/wasm",
    ".wgsl": "text/plain; charset=utf-8",
    ".d.ts": "text/plain; charset=utf-8",
    ".ts": "text/plain; charset=utf-8",
    ".py": "text/plain; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".xml": "application/xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".whl": "application/zip",
    ".zip": "application/zip",
    ".spv": "application/octet-stream",
    ".bin": "application/octet-stream",
    ".wrm": "application/octet-stream",
    ".onnx": "application/octet-stream",
    ".npy": "application/octet-stream",
    ".safetensors": "application/octet-stream",
}
DEFAULT_MIME_TYPE = "application/octet-stream"

CHUNK_SIZE = 256 * 1024
ISOLATION_HEADERS = {
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-resource-policy": "same-origin",
}


# --------------------------------------------------------------------------
# Public API


def create_app(root: str | os.PathLike[str], *, isolate: bool = False) -> Starlette:
    """A Starlette app serving the site folder `root` (see the module docstring)."""
    site = _Site(_checked_root(root))
    middleware = [Middleware(_IsolationHeaders)] if isolate else []
    app = Starlette(routes=[Route("/{path:path}", _FileEndpoint)], middleware=middleware)
    app.state.site = site
    return app


def serve(root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000,
          isolate: bool = False) -> None:
    """Serve `root` at http://host:port/ until interrupted (blocking)."""
    import uvicorn

    app = create_app(root, isolate=isolate)
    url_host = f"[{host}]" if ":" in host else host
    print(f"webiree: serving {app.state.site.root} at http://{url_host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port)


# --------------------------------------------------------------------------
# Path resolution (the security rule)


def _checked_root(root: str | os.PathLike[str]) -> str:
    real = os.path.realpath(os.fspath(root))
    if not os.path.isdir(real):
        raise ValueError(f"cannot serve {os.fspath(root)!r}: not an existing directory")
    return real


class _Forbidden(Exception):
    """The request path breaks the security rule."""


def _fully_unquoted(path: str, max_rounds: int = 8) -> str:
    """Percent-decode `path` until it no longer changes (catches double encoding)."""
    for _ in range(max_rounds):
        decoded = unquote(path)
        if decoded == path:
            return decoded
        path = decoded
    raise _Forbidden(path)


def _safe_segments(url_path: str) -> list[str]:
    """The path's segments, without empty and `.` ones; raise _Forbidden if unsafe.

    `url_path` is the path as the server decoded it (once). The checks are made
    on its fully decoded form, the segments returned are the once-decoded ones.
    """
    decoded = _fully_unquoted(url_path)
    if "\x00" in decoded or "\\" in decoded:
        raise _Forbidden(url_path)
    for segment in decoded.split("/"):
        if segment == ".." or os.path.splitdrive(segment)[0] or os.path.isabs(segment):
            raise _Forbidden(url_path)
    return [s for s in url_path.split("/") if s not in ("", ".")]


def _inside(root: str, path: str) -> bool:
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:  # e.g. another drive on Windows
        return False


@dataclass(frozen=True)
class _Site:
    root: str  # already resolved with os.path.realpath

    def resolve(self, segments: list[str]) -> str:
        """Real path of `segments` under the root; raise _Forbidden if it escapes."""
        real = os.path.realpath(os.path.join(self.root, *segments))
        if not _inside(self.root, real):
            raise _Forbidden(real)
        return real


# --------------------------------------------------------------------------
# Responses


def _media_type(path: str) -> str:
    name = os.path.basename(path).lower()
    suffixes = [s for s in MIME_TYPES if name.endswith(s)]
    if suffixes:
        return MIME_TYPES[max(suffixes, key=len)]
    return mimetypes.guess_type(name)[0] or DEFAULT_MIME_TYPE


def _etag(st: os.stat_result) -> str:
    return f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'


def _etag_matches(header: str, etag: str) -> bool:
    """If-None-Match semantics: weak comparison, `*` matches anything."""
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


_SINGLE_RANGE = re.compile(r"bytes=(\d*)-(\d*)", re.ASCII | re.IGNORECASE)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range.

    Returns None when the header should be ignored (other unit, several
    ranges, bad syntax); raises _Unsatisfiable when no byte of it exists.
    """
    match = _SINGLE_RANGE.fullmatch(header.replace(" ", ""))
    if match is None or not any(match.groups()):
        return None
    first, last = match.groups()
    if not first:  # bytes=-n: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _Unsatisfiable
        return max(size - n, 0), size - 1
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise _Unsatisfiable
    end = int(last) if last else size - 1
    return start, min(end, size - 1)


class _Unsatisfiable(Exception):
    pass


async def _read_slice(path: str, start: int, length: int) -> AsyncIterator[bytes]:
    """Yield `length` bytes of `path` from `start`, one chunk at a time."""
    with open(path, "rb") as f:
        f.seek(start)
        remaining = length
        while remaining > 0:
            chunk = await anyio.to_thread.run_sync(f.read, min(CHUNK_SIZE, remaining))
            if not chunk:  # the file shrank under us (a rebuild); stop short
                return
            remaining -= len(chunk)
            yield chunk


def _file_response(request: Request, path: str, st: os.stat_result) -> Response:
    etag = _etag(st)
    headers = {
        "etag": etag,
        "cache-control": "no-cache",
        "accept-ranges": "bytes",
        "x-content-type-options": "nosniff",
        "content-type": _media_type(path),
    }
    if _etag_matches(request.headers.get("if-none-match", ""), etag):
        return Response(status_code=304, headers=headers)

    size, start, end, status = st.st_size, 0, st.st_size - 1, 200
    range_header = request.headers.get("range")
    if range_header and request.headers.get("if-range", etag) == etag:
        try:
            byte_range = _parse_range(range_header, size)
        except _Unsatisfiable:
            return Response(status_code=416, headers={**headers, "content-range": f"bytes */{size}"})
        if byte_range is not None:
            (start, end), status = byte_range, 206
            headers["content-range"] = f"bytes {start}-{end}/{size}"

    length = end - start + 1
    headers["content-length"] = str(length)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers)
    return StreamingResponse(_read_slice(path, start, length), status_code=status, headers=headers)


def _redirect_to_directory(request: Request, segments: list[str]) -> Response:
    # Built from the checked segments, so it never starts with "//" (no open redirect).
    location = request.scope.get("root_path", "") + "/" + "/".join(quote(s) for s in segments) + "/"
    if request.url.query:
        location += "?" + request.url.query
    return RedirectResponse(location, status_code=301)


def _not_found() -> Response:
    return PlainTextResponse("Not Found", status_code=404)


def _forbidden() -> Response:
    return PlainTextResponse("Forbidden", status_code=403)


class _FileEndpoint(HTTPEndpoint):
    """GET/HEAD of one path; HTTPEndpoint answers other methods with 405."""

    async def get(self, request: Request) -> Response:
        site: _Site = request.app.state.site
        url_path = request.path_params["path"]
        try:
            segments = _safe_segments(url_path)
            path = site.resolve(segments)
            if os.path.isdir(path):
                if segments and not url_path.endswith("/"):
                    return _redirect_to_directory(request, segments)
                path = site.resolve([*segments, "index.html"])
        except _Forbidden:
            return _forbidden()
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return _not_found()
        if not stat.S_ISREG(st.st_mode):
            return _not_found()
        return _file_response(request, path, st)

    head = get


class _IsolationHeaders:
    """ASGI middleware adding the cross-origin isolation headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in ISOLATION_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


@contextmanager
def serve_in_thread(root):
    """The dev server over `root` on a free loopback port, in a thread (tests, benchmarks); yields
    the base URL and stops the server after."""
    import threading
    import time

    import uvicorn

    srv = uvicorn.Server(uvicorn.Config(create_app(root), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the webiree server did not start")
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        srv.should_exit = True
        thread.join(10)
