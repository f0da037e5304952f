"""The dashboard's HTTP server: a page, its script, Plotly, and a read-only JSON API over :mod:`.runs`.

Python's own ``ThreadingHTTPServer``: the dashboard serves a handful of small JSON answers to one team,
so a web framework would add a dependency and nothing else. Charts are Plotly's, served from the
``plotly`` package's own copy of ``plotly.min.js`` (no CDN: it works offline and behind a wall).

Routes (GET only)::

    /                        the page (static/index.html), views chosen by the URL's #fragment
    /static/<file>           app.js, style.css; /static/plotly.min.js from the plotly package
    /api/runs                the run list (runs.summarize of each run)
    /api/run?id=             one run (runs.detail)
    /api/metrics?id=&after=  metric records past the first `after` (what a live page polls)
    /api/samples?id=&min=&max=&step=
    /api/compare?id=&id=     several runs' records and their configs' differences
    /api/plot?id=&name=      a PNG the run wrote (a stage's loss plots)
    /report?id=              an evaluation's report.html, with scripts forbidden

Access: bound to 127.0.0.1 by default. Any other address needs a token (from the environment or a
file, never the command line); a request then carries it as ``Authorization: Bearer <token>``, or
once as ``?token=`` on the page's address, which sets a cookie. Every answer forbids framing and
inline scripts (Content-Security-Policy), so model output the page shows cannot run as code even if
a view forgot to treat it as text.
"""

from __future__ import annotations

import hmac
import http.cookies
import ipaddress
import json
import math
import mimetypes
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trainer_lib.dashboard import runs as runs_mod
from trainer_lib.errors import UserError

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STATIC_FILES = ("index.html", "app.js", "style.css")
#: evaluate's report.html, served as it is: a page with no script at all (its model text is escaped already)
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'none'"
COOKIE = "posttrain_dashboard"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plotly_js() -> bytes:
    """The plotly package's ``plotly.min.js`` (read once)."""
    from importlib.resources import files

    return (files("plotly") / "package_data" / "plotly.min.js").read_bytes()


class Dashboard:
    """What the handler serves: the roots' runs, rescanned at most every ``rescan_s`` seconds."""

    def __init__(self, roots: list[str], token: str | None = None, rescan_s: float = 2.0, kfp: dict | None = None):
        """``kfp``: ``{"host", "namespace", "pipeline_root"}`` to add a Kubeflow Pipelines instance's runs."""
        self.roots, self.token, self.rescan_s, self.kfp = list(roots), token, rescan_s, kfp
        self._runs: dict[str, runs_mod.Run] = {}
        self._scanned = 0.0
        self._lock = threading.Lock()
        self._plotly: bytes | None = None
        self._kfp_roots: list[runs_mod.Root] = []
        self._kfp_listed = -1e9
        self.kfp_error = ""
        self.root_problems: list[str] = []
        self.root_problems: list[str] = []

    def kfp_roots(self) -> list[runs_mod.Root]:
        """The KFP instance's runs as roots, listed again at most every 10 s; the last list stands (with
        the error shown) while the API cannot be reached."""
        import time

        if not self.kfp or time.monotonic() - self._kfp_listed < 10.0:
            return self._kfp_roots
        from trainer_lib.dashboard.kfp_runs import list_kfp_runs

        try:
            found = list_kfp_runs(self.kfp["host"], self.kfp.get("namespace"), self.kfp["pipeline_root"])
            self._kfp_roots = [runs_mod.Root(f"kfp-{r.run_id}", r.location, r.name, r.state) for r in found]
            self.kfp_error = ""
        except Exception as exc:  # (kfp's client raises its own and urllib3's errors)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.kfp_error = runs_mod.storage.redact(f"{type(exc).__name__}: {first}"[:300])
        self._kfp_listed = time.monotonic()
        return self._kfp_roots

    def runs(self, fresh: bool = False) -> dict[str, runs_mod.Run]:
        import time

        with self._lock:
            if fresh or time.monotonic() - self._scanned > self.rescan_s:
                self.root_problems = []
                self._runs = runs_mod.find_runs([*self.roots, *self.kfp_roots()], self.root_problems)
                self._scanned = time.monotonic()
            return self._runs

    def run(self, run_id: str) -> runs_mod.Run:
        found = self.runs().get(run_id) or self.runs(fresh=True).get(run_id)
        if found is None:
            raise LookupError(f"no run {run_id!r} under the dashboard's roots")
        return found

    def plotly(self) -> bytes:
        if self._plotly is None:
            self._plotly = plotly_js()
        return self._plotly

    # ---- the API's answers
    def answer(self, route: str, query: dict[str, list[str]]):
        one = {key: values[-1] for key, values in query.items()}
        if route == "/api/runs":
            rows = [runs_mod.summarize(run) for run in self.runs(fresh=True).values()]
            roots = [runs_mod.storage.redact(r) for r in self.roots]
            if self.kfp:
                roots.append(f"Kubeflow Pipelines at {runs_mod.storage.redact(self.kfp['host'])}")
            return {"roots": roots, "runs": rows, "kfp_error": self.kfp_error, "root_problems": self.root_problems}
        if route == "/api/run":
            return runs_mod.detail(self.run(one.get("id", "")))
        if route == "/api/metrics":
            return runs_mod.metrics_after(self.run(one.get("id", "")), _int(one.get("after"), 0))
        if route == "/api/samples":
            return runs_mod.samples(
                self.run(one.get("id", "")),
                min_reward=_float(one.get("min")),
                max_reward=_float(one.get("max")),
                step=_int(one.get("step"), None),
            )
        if route == "/api/compare":
            chosen = [self.run(run_id) for run_id in query.get("id", [])]
            details = {run.id: runs_mod.detail(run) for run in chosen}
            return {
                "runs": [{k: d[k] for k in ("id", "stage", "status", "location", "metrics")} for d in details.values()],
                "differences": runs_mod.config_differences({i: d["config"] for i, d in details.items()}),
            }
        raise LookupError(f"no route {route}")


def _int(text, default):
    try:
        return int(text) if text not in (None, "") else default
    except ValueError:
        return default


def _float(text):
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def finite(value):
    """``value`` with NaN and infinities as None (JSON has neither; a diverged run logs them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def make_handler(dashboard: Dashboard):
    class Handler(BaseHTTPRequestHandler):
        server_version = "posttrain-dashboard"

        def log_message(self, format, *args):
            pass  # (request lines would carry ?token=)

        def do_GET(self):
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            cookie = None
            if dashboard.token is not None:
                given = self._token(query)
                if given is None or not hmac.compare_digest(given.encode(), dashboard.token.encode()):
                    return self._send(
                        401, b"a token is needed (Authorization: Bearer, or ?token= once)\n", "text/plain"
                    )
                if "token" in query:
                    cookie = f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/"
            try:
                self._route(parts.path, query, cookie)
            except LookupError as exc:
                self._json(404, {"error": str(exc)})
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _token(self, query) -> str | None:
            header = self.headers.get("Authorization", "")
            if header.startswith("Bearer "):
                return header[len("Bearer ") :].strip()
            if "token" in query:
                return query["token"][-1]
            jar = http.cookies.SimpleCookie(self.headers.get("Cookie", ""))
            return jar[COOKIE].value if COOKIE in jar else None

        def _route(self, path: str, query, cookie) -> None:
            if path in ("/", "/index.html"):
                return self._file("index.html", cookie)
            if path == "/static/plotly.min.js":
                return self._send(200, dashboard.plotly(), "text/javascript", cache=True)
            if path.startswith("/static/") and path[len("/static/") :] in STATIC_FILES:
                return self._file(path[len("/static/") :], cookie)
            if path == "/api/plot":
                run = dashboard.run(query.get("id", [""])[-1])
                name = query.get("name", [""])[-1]
                if name not in run.files or not name.endswith(".png"):
                    raise LookupError(f"no plot {name!r} in run {run.id}")
                return self._send(200, runs_mod.storage.read_bytes(run.path(name)), "image/png")
            if path == "/report":
                run = dashboard.run(query.get("id", [""])[-1])
                if "report.html" not in run.files:
                    raise LookupError(f"run {run.id} has no report.html")
                body = runs_mod.storage.read_bytes(run.path("report.html"))
                return self._send(200, body, "text/html", csp=REPORT_CSP)
            if path.startswith("/api/"):
                return self._json(200, dashboard.answer(path, query))
            raise LookupError(f"no page {path}")

        def _file(self, name: str, cookie=None) -> None:
            with open(os.path.join(STATIC, name), "rb") as fh:
                body = fh.read()
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            self._send(200, body, kind, cookie=cookie)

        def _json(self, code: int, value) -> None:
            self._send(code, json.dumps(finite(value), default=str, allow_nan=False).encode(), "application/json")

        def _send(self, code: int, body: bytes, kind: str, cookie=None, cache: bool = False, csp: str = CSP) -> None:
            self.send_response(code)
            self.send_header(
                "Content-Type", kind + ("; charset=utf-8" if kind.startswith(("text/", "application/json")) else "")
            )
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", csp)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
            if cookie:
                self.send_header("Set-Cookie", cookie)
            self.end_headers()
            self.wfile.write(body)

    return Handler


def serve(dashboard: Dashboard, host: str, port: int) -> ThreadingHTTPServer:
    """A bound server (call ``serve_forever``); a non-loopback ``host`` without a token is refused."""
    if not is_loopback(host) and not dashboard.token:
        raise UserError(
            f"--host {host}: the dashboard binds beyond this machine only with an access token "
            f"(set POSTTRAIN_DASHBOARD_TOKEN or --token-file FILE)"
        )
    server = ThreadingHTTPServer((host, port), make_handler(dashboard))
    server.daemon_threads = True
    return server
