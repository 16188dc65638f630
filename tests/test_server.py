"""Tests of the local dev server (webiree.bundler.server).

Three ways in:
* `TestClient` for ordinary requests;
* `asgi_call`, which hands the app a scope built by hand exactly as uvicorn
  would (path percent-decoded once, nothing normalised), because httpx folds
  `..` segments out of URLs before they are sent;
* a real uvicorn server on 127.0.0.1 spoken to over raw sockets.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import pytest
import uvicorn
from starlette.testclient import TestClient

from webiree.bundler import server as server_mod
from webiree.bundler.server import CHUNK_SIZE, create_app, serve

pytestmark = pytest.mark.timeout(60)

SECRET = b"TOP-SECRET-do-not-serve"
BIG_SIZE = 4 * 1024 * 1024 + 123

FILES = {
    "index.html": b"<!doctype html><title>root index</title>",
    "app.js": b"console.log('app');",
    "mod.mjs": b"export const x = 1;",
    "data.json": b'{"a": 1}',
    "model.wasm": b"\x00asm\x01\x00\x00\x00",
    "shader.wgsl": b"@compute @workgroup_size(1) fn main() {}",
    "shader.spv": b"\x03\x02\x23\x07",
    "weights.bin": bytes(range(256)) * 4,
    "model.wrm": b"WRM0",
    "runtime-0.1-py3-none-any.whl": b"PK\x03\x04",
    "style.css": b"body{}",
    "logo.png": b"\x89PNG\r\n\x1a\n",
    "icon.svg": b"<svg xmlns='http://www.w3.org/2000/svg'/>",
    "webiree.d.ts": b"export declare function run(): void;",
    "blob.unknownext": b"????",
    "empty.bin": b"",
    "sub/index.html": b"<title>sub index</title>",
    "sub/page.js": b"// sub page",
    "nodir-index/readme.txt": b"no index here",
}

MIME_CASES = [
    ("/index.html", "text/html"),
    ("/app.js", "text/javascript"),
    ("/mod.mjs", "text/javascript"),
    ("/data.json", "application/json"),
    ("/model.wasm", "application/wasm"),
    ("/shader.wgsl", "text/plain"),
    ("/shader.spv", "application/octet-stream"),
    ("/weights.bin", "application/octet-stream"),
    ("/model.wrm", "application/octet-stream"),
    ("/blob.unknownext", "application/octet-stream"),
    ("/runtime-0.1-py3-none-any.whl", "application/zip"),
    ("/style.css", "text/css"),
    ("/logo.png", "image/png"),
    ("/icon.svg", "image/svg+xml"),
    ("/webiree.d.ts", "text/plain"),
]

# Request targets exactly as they go on the wire. Each must be refused with 403.
FORBIDDEN_TARGETS = [
    "/../secret.txt",
    "/../../secret.txt",
    "/sub/../../secret.txt",
    "/./../secret.txt",
    "/%2e%2e/secret.txt",
    "/%2E%2E/secret.txt",
    "/%2E%2E%2fsecret.txt",
    "/%2e%2e%2Fsecret.txt",
    "/.%2e/secret.txt",
    "/..%2fsecret.txt",
    "/sub/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/%252e%252e/secret.txt",
    "/%252e%252e%252fsecret.txt",
    "/%25252e%25252e%25252fsecret.txt",
    "/..%5csecret.txt",
    "/..%255csecret.txt",
    "/sub%5c..%5c..%5csecret.txt",
    "/secret.txt%00",
    "/index.html%00.png",
    "/%00/../secret.txt",
    "/escape/secret.txt",
    "/link-out.txt",
]
# Absolute paths are taken relative to the root: not found, never the real file.
ABSOLUTE_TARGETS = ["//etc/passwd", "/%2fetc%2fpasswd"]


# --------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "big.bin").write_bytes(random.Random(1234).randbytes(BIG_SIZE))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "link-out.txt").symlink_to(tmp_path / "secret.txt")
    (root / "alias.js").symlink_to(root / "app.js")
    (root / "subalias").symlink_to(Path("sub"), target_is_directory=True)
    return root


@pytest.fixture
def client(site: Path) -> TestClient:
    return TestClient(create_app(site))


def absolute_targets(site: Path) -> list[str]:
    return [*ABSOLUTE_TARGETS, "/" + str(site.parent / "secret.txt")]


def asgi_call(app, target: str, method: str = "GET", headers: dict[str, str] | None = None):
    """Call the ASGI app with the scope uvicorn would build for `target`.

    Returns (status, headers, list of body chunks).
    """
    raw_path, _, query = target.encode("ascii").partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path.decode("ascii")),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    asyncio.run(app(scope, receive, send))
    start = messages[0]
    response_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    chunks = [m.get("body", b"") for m in messages[1:] if m.get("body")]
    return start["status"], response_headers, chunks


def media_type(response) -> str:
    return response.headers["content-type"].split(";")[0].strip()


class RunningServer:
    """uvicorn serving `app` in a background thread on a free 127.0.0.1 port."""

    def __init__(self, app):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # bound before uvicorn starts: no race for the port
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                backlog=512)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> "RunningServer":
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not shut down"


def raw_request(port: int, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Send `target` byte for byte (no client-side normalisation); return (status, raw reply)."""
    request = (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               "Connection: close\r\n\r\n").encode("latin-1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, reply


def check_concurrent_ranges(port: int, path: str, data: bytes, requests, workers: int) -> None:
    """Send every (Range header, first, last) request at once from `workers` threads; each answer
    must be a 206 with the right Content-Range and exactly data[first:last + 1]."""
    def fetch(item):
        header, start, end = item
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        try:
            conn.request("GET", path, headers={"Range": header})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Range"), r.read(), start, end
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(fetch, requests, timeout=45))
    assert len(results) == len(requests)
    for status, content_range, body, start, end in results:
        assert status == 206
        assert content_range == f"bytes {start}-{end}/{len(data)}"
        assert body == data[start:end + 1]


# --------------------------------------------------------------------------
# Content types, index.html, 404, 405


@pytest.mark.parametrize(("path", "expected"), MIME_CASES)
def test_mime_types(client, path, expected):
    response = client.get(path)
    assert response.status_code == 200
    assert media_type(response) == expected
    assert response.content == FILES[path.lstrip("/")]


def test_html_has_utf8_charset(client):
    assert client.get("/index.html").headers["content-type"] == "text/html; charset=utf-8"


def test_root_serves_index_html(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response.content == FILES["index.html"]
    assert media_type(response) == "text/html"


def test_directory_serves_its_index_html(client):
    assert client.get("/sub/").content == FILES["sub/index.html"]
    assert client.get("/sub/?v=3").content == FILES["sub/index.html"]


def test_directory_without_slash_redirects(client):
    response = client.get("/sub", follow_redirects=False)
    assert response.status_code == 301
    assert response.headers["location"] == "/sub/"
    assert client.get("/sub?x=1", follow_redirects=False).headers["location"] == "/sub/?x=1"


def test_directory_without_index_is_404_not_a_listing(client):
    response = client.get("/nodir-index/")
    assert response.status_code == 404
    assert b"readme" not in response.content


@pytest.mark.parametrize("path", ["/missing.js", "/sub/missing.html", "/app.js/extra"])
def test_missing_file_is_404(client, path):
    assert client.get(path).status_code == 404


def test_query_string_is_ignored(client):
    assert client.get("/app.js?v=123").content == FILES["app.js"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_405(client, method):
    response = client.request(method, "/app.js")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


# --------------------------------------------------------------------------
# Caching


def test_etag_and_no_cache(client):
    response = client.get("/app.js")
    etag = response.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"')  # strong
    assert response.headers["cache-control"] == "no-cache"
    assert client.get("/app.js").headers["etag"] == etag


@pytest.mark.parametrize("form", ["{etag}", "W/{etag}", '"other", {etag}', "*"])
def test_if_none_match_gives_304(client, form):
    etag = client.get("/app.js").headers["etag"]
    response = client.get("/app.js", headers={"If-None-Match": form.format(etag=etag)})
    assert response.status_code == 304
    assert response.content == b""
    assert response.headers["etag"] == etag
    assert response.headers["cache-control"] == "no-cache"


def test_stale_etag_gives_200(client):
    response = client.get("/app.js", headers={"If-None-Match": '"not-the-tag"'})
    assert response.status_code == 200
    assert response.content == FILES["app.js"]


def test_etag_changes_when_file_is_rebuilt(client, site):
    etag = client.get("/app.js").headers["etag"]
    (site / "app.js").write_bytes(b"console.log('rebuilt');")
    st = (site / "app.js").stat()
    os.utime(site / "app.js", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    response = client.get("/app.js", headers={"If-None-Match": etag})
    assert response.status_code == 200
    assert response.content == b"console.log('rebuilt');"
    assert response.headers["etag"] != etag


# --------------------------------------------------------------------------
# Ranges


def big(site: Path) -> bytes:
    return (site / "big.bin").read_bytes()


@pytest.mark.parametrize(("header", "start", "end"), [
    ("bytes=0-99", 0, 99),
    ("bytes=1000-1000", 1000, 1000),
    ("bytes=4194000-", 4194000, BIG_SIZE - 1),
    ("bytes=-500", BIG_SIZE - 500, BIG_SIZE - 1),
    ("bytes=10-99999999", 10, BIG_SIZE - 1),
    ("bytes=-99999999", 0, BIG_SIZE - 1),
])
def test_range_forms(client, site, header, start, end):
    response = client.get("/big.bin", headers={"Range": header})
    assert response.status_code == 206
    assert response.headers["content-range"] == f"bytes {start}-{end}/{BIG_SIZE}"
    assert response.headers["content-length"] == str(end - start + 1)
    assert response.headers["accept-ranges"] == "bytes"
    assert response.content == big(site)[start:end + 1]


@pytest.mark.parametrize(("path", "header", "size"), [
    ("/big.bin", f"bytes={BIG_SIZE}-", BIG_SIZE),
    ("/big.bin", f"bytes={BIG_SIZE + 10}-{BIG_SIZE + 20}", BIG_SIZE),
    ("/big.bin", "bytes=-0", BIG_SIZE),
    ("/empty.bin", "bytes=0-", 0),
])
def test_unsatisfiable_range_is_416(client, path, header, size):
    response = client.get(path, headers={"Range": header})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize("header", [
    "bytes=0-9,20-29",  # several ranges: documented to give the whole file
    "bytes=abc",
    "bytes=9-3",
    "items=0-9",
    "bytes=¹-2",
])
def test_ignored_range_gives_whole_file(client, header):
    response = client.get("/weights.bin", headers={"Range": header.encode("latin-1")})
    assert response.status_code == 200
    assert response.content == FILES["weights.bin"]
    assert "content-range" not in response.headers


def test_if_range(client):
    etag = client.get("/weights.bin").headers["etag"]
    match = client.get("/weights.bin", headers={"Range": "bytes=0-9", "If-Range": etag})
    assert match.status_code == 206 and match.content == FILES["weights.bin"][:10]
    stale = client.get("/weights.bin", headers={"Range": "bytes=0-9", "If-Range": '"old"'})
    assert stale.status_code == 200 and stale.content == FILES["weights.bin"]


def test_every_file_response_accepts_ranges(client):
    for path, _ in MIME_CASES:
        assert client.get(path).headers["accept-ranges"] == "bytes"


def test_large_file_is_streamed_in_chunks(site):
    status, headers, chunks = asgi_call(create_app(site), "/big.bin")
    assert status == 200 and headers["content-length"] == str(BIG_SIZE)
    assert len(chunks) > 1 and max(map(len, chunks)) <= CHUNK_SIZE
    assert b"".join(chunks) == big(site)


def test_range_reads_only_its_slice(site, monkeypatch):
    reads = []
    real_read_slice = server_mod._read_slice

    def spy(path, start, length):
        reads.append((start, length))
        return real_read_slice(path, start, length)

    monkeypatch.setattr(server_mod, "_read_slice", spy)
    status, _, chunks = asgi_call(create_app(site), "/big.bin", headers={"Range": "bytes=100-199"})
    assert status == 206 and reads == [(100, 100)]
    assert b"".join(chunks) == big(site)[100:200]


# --------------------------------------------------------------------------
# HEAD


def test_head_has_no_body_but_full_length(client):
    response = client.head("/big.bin")
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["content-length"] == str(BIG_SIZE)
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["etag"] == client.get("/big.bin").headers["etag"]


def test_head_range(client):
    response = client.head("/big.bin", headers={"Range": "bytes=0-9"})
    assert response.status_code == 206
    assert response.content == b""
    assert response.headers["content-length"] == "10"


def test_head_of_index(client):
    response = client.head("/")
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(FILES["index.html"]))


# --------------------------------------------------------------------------
# Cross-origin isolation


ISOLATION = {
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-resource-policy": "same-origin",
}


def test_isolate_headers_on_every_response(site):
    client = TestClient(create_app(site, isolate=True))
    etag = client.get("/app.js").headers["etag"]
    responses = [
        client.get("/"),
        client.get("/app.js"),
        client.head("/app.js"),
        client.get("/app.js", headers={"If-None-Match": etag}),
        client.get("/big.bin", headers={"Range": "bytes=0-1"}),
        client.get("/big.bin", headers={"Range": "bytes=-0"}),
        client.get("/missing"),
        client.get("/sub", follow_redirects=False),
        client.post("/app.js"),
        client.get("/%2e%2e/secret.txt"),
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 304, 206, 416, 404, 301, 405, 403]
    for response in responses:
        for name, value in ISOLATION.items():
            assert response.headers[name] == value


def test_no_isolate_headers_by_default(client):
    response = client.get("/")
    assert not set(ISOLATION) & set(response.headers)


# --------------------------------------------------------------------------
# Staying inside the root


@pytest.mark.parametrize("target", FORBIDDEN_TARGETS)
def test_traversal_refused_at_asgi_level(site, target):
    status, _, chunks = asgi_call(create_app(site), target)
    assert status == 403
    assert SECRET not in b"".join(chunks)


def test_absolute_paths_stay_inside_root(site):
    app = create_app(site)
    for target in absolute_targets(site):
        status, _, chunks = asgi_call(app, target)
        assert status == 404, target
        assert SECRET not in b"".join(chunks)


@pytest.mark.parametrize("target", [t for t in FORBIDDEN_TARGETS if "%" in t or "escape" in t
                                    or "link" in t])
def test_traversal_refused_through_testclient(client, target):
    response = client.get(target)
    assert response.status_code in (403, 404)
    assert SECRET not in response.content


def test_symlink_out_of_root_is_refused(client):
    assert client.get("/link-out.txt").status_code == 403
    assert client.get("/escape/secret.txt").status_code == 403
    assert client.get("/escape/").status_code == 403


def test_symlink_inside_root_is_served(client):
    assert client.get("/alias.js").content == FILES["app.js"]
    assert client.get("/subalias/page.js").content == FILES["sub/page.js"]
    assert client.get("/subalias/").content == FILES["sub/index.html"]


def test_index_html_symlinked_out_is_refused(site, tmp_path):
    (site / "sub" / "index.html").unlink()
    (site / "sub" / "index.html").symlink_to(tmp_path / "secret.txt")
    response = TestClient(create_app(site)).get("/sub/")
    assert response.status_code == 403
    assert SECRET not in response.content


def test_root_reached_through_a_symlink(site, tmp_path):
    link = tmp_path / "site-link"
    link.symlink_to(site, target_is_directory=True)
    client = TestClient(create_app(link))
    assert client.get("/app.js").content == FILES["app.js"]
    assert client.get("/%2e%2e/secret.txt").status_code == 403


# --------------------------------------------------------------------------
# serve()


def test_serve_rejects_missing_root(tmp_path):
    with pytest.raises(ValueError, match="not an existing directory"):
        serve(tmp_path / "nope")
    with pytest.raises(ValueError, match="not an existing directory"):
        create_app(tmp_path / "nope")


def test_serve_rejects_a_file_root(site):
    with pytest.raises(ValueError, match="not an existing directory"):
        serve(site / "app.js")


def test_serve_prints_url_and_runs_uvicorn(site, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    serve(site, port=8123, isolate=True)
    expected = f"webiree: serving {os.path.realpath(site)} at http://127.0.0.1:8123/\n"
    assert capsys.readouterr().out == expected
    (app, kw), = calls
    assert kw == {"host": "127.0.0.1", "port": 8123}
    assert TestClient(app).get("/").headers["cross-origin-opener-policy"] == "same-origin"


# --------------------------------------------------------------------------
# A real server


def test_real_server_traversal_and_concurrent_ranges(site):
    data = big(site)
    with RunningServer(create_app(site)) as srv:
        # Traversal, with the request target sent exactly as written.
        for target in [*FORBIDDEN_TARGETS, "/..\\secret.txt", "/sub\\..\\..\\secret.txt"]:
            status, reply = raw_request(srv.port, target)
            assert status in (400, 403), (target, reply[:200])
            assert SECRET not in reply, target
        for target in absolute_targets(site):
            status, reply = raw_request(srv.port, target)
            assert status in (400, 404), (target, reply[:200])
            assert SECRET not in reply, target
        status, reply = raw_request(srv.port, "/")
        assert status == 200 and reply.endswith(FILES["index.html"])

        # 200 concurrent Range requests, every slice checked byte for byte.
        rng = random.Random(99)

        def make_request():
            form = rng.choice(["a-b", "a-", "-n"])
            if form == "a-b":
                start = rng.randrange(BIG_SIZE)
                end = min(start + rng.randrange(1, 256 * 1024), BIG_SIZE - 1)
                return f"bytes={start}-{end}", start, end
            if form == "a-":
                start = rng.randrange(BIG_SIZE - 256 * 1024, BIG_SIZE)
                return f"bytes={start}-", start, BIG_SIZE - 1
            n = rng.randrange(1, 256 * 1024)
            return f"bytes=-{n}", BIG_SIZE - n, BIG_SIZE - 1

        requests = [make_request() for _ in range(200)]

        check_concurrent_ranges(srv.port, "/big.bin", data, requests, workers=32)

        # Still alive and well.
        status, reply = raw_request(srv.port, "/app.js")
        assert status == 200 and reply.endswith(FILES["app.js"])


# --------------------------------------------------------------------------
# A real build: the weights file under concurrent Range requests


def test_real_build_weights_under_200_concurrent_ranges(tmp_path):
    """Serve an actual `webiree.compile` output over loopback: 200 concurrent Range requests
    for weights.bin (the file a browser runtime fetches in slices), every slice checked byte
    for byte; traversal and non-GET/HEAD methods refused on the same live server."""
    import webiree
    from webiree.testing import models

    site = tmp_path / "site"
    webiree.compile(models.mlp(sizes=(256, 512, 10)), site)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    weights = (site / "weights.bin").read_bytes()
    size = len(weights)
    assert size > 500_000
    rng = random.Random(5)
    requests = []
    for _ in range(200):
        form = rng.choice(["a-b", "a-", "-n", "page"])
        if form == "a-b":
            start = rng.randrange(size)
            end = min(start + rng.randrange(1, 64 * 1024), size - 1)
        elif form == "a-":
            start, end = rng.randrange(size - 4096, size), size - 1
        elif form == "-n":
            n = rng.randrange(1, 8192)
            start, end = size - n, size - 1
        else:                                   # one 256-aligned page, as the runtime asks
            start = rng.randrange(size // 256) * 256
            end = min(start + 255, size - 1)
        header = {"a-b": f"bytes={start}-{end}", "page": f"bytes={start}-{end}", "a-": f"bytes={start}-",
                  "-n": f"bytes=-{size - start}"}[form]
        requests.append((header, start, end))

    with RunningServer(create_app(site)) as srv:
        check_concurrent_ranges(srv.port, "/weights.bin", weights, requests, workers=50)

        for target in ["/../secret.txt", "/%2e%2e/secret.txt", "/%2e%2e%2fsecret.txt", "//etc/passwd",
                       "/" + str(tmp_path / "secret.txt")]:
            status, reply = raw_request(srv.port, target)
            assert status in (400, 403, 404) and SECRET not in reply, target
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
            status, reply = raw_request(srv.port, "/weights.bin", method)
            assert status == 405, (method, reply[:200])
        status, reply = raw_request(srv.port, "/model.wrm", "HEAD")
        assert status == 200 and reply.endswith(b"\r\n\r\n")
