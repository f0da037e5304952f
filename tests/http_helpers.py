"""A real HTTP server on 127.0.0.1 for API fakes written in a test: real clients do real HTTP to it.

A test gives an ``app`` with ``handle(request) -> (status, json_body)``; every request is recorded
(method, path, query, headers, parsed JSON or raw body) so the test can assert on what was sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict  # name -> last value
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body or b"null")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients expect

    def _serve(self):
        url = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = Request(
            self.command,
            urllib.parse.unquote(url.path),
            {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()},
            {k.lower(): v for k, v in self.headers.items()},
            body,
        )
        self.server.requests.append(request)
        try:
            status, reply = self.server.app.handle(request)
        except Exception as exc:  # a bug in the test's app: make it visible to the client too
            status, reply = 500, {"message": f"{type(exc).__name__}: {exc}"}
            self.server.errors.append(exc)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, *args):  # keep pytest output clean
        pass


@contextlib.contextmanager
def serving(app):
    """Run ``app`` on a free port; yields the server (``.url``, ``.requests``, ``.errors``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.app, server.requests, server.errors = app, [], []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
