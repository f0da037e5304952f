"""Run a real ``tritonserver`` on a model repository (local dir or s3://), for ``posttrain serve`` and tests.

The server comes from the ``nvidia-pytriton`` wheel, which ships ``tritonserver`` with the Python
backend only. It lives in its own small environment (``make triton-env`` -> ``.venv-triton``): the
wheel pins numpy < 2, and the backend's stub runs each ``model.py`` in that same environment, where
numpy 2 would break every response. How it is started (see FACTS.md, "Triton"):

* a backend directory made of links (``python/``: the backend ``.so``, its utils and the stub for the
  environment's Python version);
* ``LD_LIBRARY_PATH`` with the base Python's lib dir first, else the stub may pick up another
  libpython and every load fails;
* the environment's ``bin`` first on ``PATH``: the stub runs the first ``python3`` it finds there;
* explicit model control, no auto-completed configs, 127.0.0.1 and explicit free ports.

    with TritonServer("s3://bucket/repo", load=["posttrain"]) as server:
        print(server.url)  # http://127.0.0.1:PORT
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from trainer_lib.errors import UserError

ENV_VAR = "POSTTRAIN_TRITON_ENV"
ENV_DIR = ".venv-triton"
HOW_TO = (
    f"create it with 'make triton-env' (a venv '{ENV_DIR}' next to the project's .venv holding "
    f"nvidia-pytriton, numpy<2, onnxruntime and tokenizers) or point ${ENV_VAR} at such a venv"
)


class TritonServerError(RuntimeError):
    """tritonserver exited or did not become ready; the message ends with its log."""


def find_env(env: str | None = None) -> str:
    """The venv that holds ``tritonserver`` (nvidia-pytriton) and runs the Python-backend stub.

    Looked up in order: ``env``, ``$POSTTRAIN_TRITON_ENV``, ``.venv-triton`` next to the active
    venv, ``.venv-triton`` at the source checkout's root, then the running interpreter itself (an
    image that installed nvidia-pytriton with numpy < 2)."""
    explicit = env or os.environ.get(ENV_VAR)
    if explicit:
        if not _server_binary(explicit):
            raise UserError(
                f"{explicit}: no tritonserver in this environment (from {'env' if env else ENV_VAR}); {HOW_TO}"
            )
        return os.path.abspath(explicit)
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for candidate in (os.path.join(os.path.dirname(sys.prefix), ENV_DIR), os.path.join(checkout, ENV_DIR), sys.prefix):
        if _server_binary(candidate):
            return os.path.abspath(candidate)
    raise UserError(f"no Triton environment found; {HOW_TO}")


def _site_packages(env: str) -> str | None:
    found = sorted(glob.glob(os.path.join(env, "lib", "python3*", "site-packages", "pytriton")))
    return os.path.dirname(found[-1]) if found else None


def _server_binary(env: str) -> str | None:
    site = _site_packages(env)
    path = site and os.path.join(site, "pytriton", "tritonserver", "bin", "tritonserver")
    return path if path and os.access(path, os.X_OK) else None


def _python_info(env: str) -> tuple[str, str]:
    """(``3.11``, the base interpreter's lib dir) of the environment's python3."""
    code = "import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_config_var('LIBDIR'))"
    out = subprocess.run([os.path.join(env, "bin", "python3"), "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise UserError(f"{env}/bin/python3 does not run ({out.stderr.strip()[-300:]}); {HOW_TO}")
    version, libdir = out.stdout.split()
    return version, libdir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def triton_repository_uri(repository: str, endpoint_url: str | None = None) -> str:
    """Triton's spelling of a repository: ``s3://http://host:port/bucket/prefix`` for a custom endpoint."""
    if not repository.startswith("s3://"):
        return os.path.abspath(repository)
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    path = repository[len("s3://") :].rstrip("/")
    return f"s3://{endpoint.rstrip('/')}/{path}" if endpoint else f"s3://{path}"


def _die_with_parent():
    """A preexec_fn: the server gets SIGTERM when the thread that started it dies, so a killed test
    or CLI never leaves one behind. Resolved here, in the parent: the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class TritonServer:
    """A ``tritonserver`` child process on ``repository``; a context manager that starts and stops it.

    ``load``: model names to load at start (``["*"]``: all, ``[]``: none; the rest through the load
    API, e.g. by ``posttrain deploy``). Ports default to free ones. ``log_path``: the server's log
    file (default: a temp file, quoted in errors; ``"-"``: our stderr)."""

    def __init__(
        self,
        repository: str,
        *,
        load: list[str] | tuple = ("*",),
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        address: str = "127.0.0.1",
        env: str | None = None,
        s3_endpoint_url: str | None = None,
        exit_timeout_s: int = 5,
        log_path: str | None = None,
        extra_args: list[str] | tuple = (),
    ):
        self.repository = repository
        self.load = list(load)
        self.address = address
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.env = find_env(env)
        self.s3_endpoint_url = s3_endpoint_url
        self.exit_timeout_s = exit_timeout_s
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None
        self._tmp: str | None = None
        self._clients: list = []

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address
        return f"http://{host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        host = "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address
        return f"{host}:{self.grpc_port}"

    def command(self, backend_dir: str) -> list[str]:
        repository = triton_repository_uri(self.repository, self.s3_endpoint_url)
        cmd = [
            _server_binary(self.env),
            f"--model-repository={repository}",
            f"--backend-directory={backend_dir}",
            "--model-control-mode=explicit",
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--http-address={self.address}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.address}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.address}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
        ]
        return cmd + [f"--load-model={name}" for name in self.load] + self.extra_args

    def _environment(self, libdir: str) -> dict:
        env = dict(os.environ)
        libs = os.path.join(_site_packages(self.env), "nvidia_pytriton.libs")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, libs, env.get("LD_LIBRARY_PATH")) if p)
        env["PATH"] = os.pathsep.join(p for p in (os.path.join(self.env, "bin"), env.get("PATH")) if p)
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the stub must see only its own env
            env.pop(var, None)
        return env

    def _backend_dir(self, pyversion: str) -> str:
        site = os.path.join(_site_packages(self.env), "pytriton", "tritonserver")
        stub = os.path.join(site, "python_backend_stubs", pyversion, "triton_python_backend_stub")
        if not os.path.exists(stub):
            raise UserError(f"{self.env}: nvidia-pytriton has no Python-backend stub for Python {pyversion}; {HOW_TO}")
        python_dir = os.path.join(self._tmp, "backends", "python")
        os.makedirs(python_dir)
        for src in (
            os.path.join(site, "backends", "python", "libtriton_python.so"),
            os.path.join(site, "backends", "python", "triton_python_backend_utils.py"),
            stub,
        ):
            os.symlink(src, os.path.join(python_dir, os.path.basename(src)))
        return os.path.dirname(python_dir)

    def start(self, timeout_s: float = 60.0) -> TritonServer:
        pyversion, libdir = _python_info(self.env)
        self._tmp = tempfile.mkdtemp(prefix="posttrain-triton-")
        command = self.command(self._backend_dir(pyversion))
        if self.log_path == "-":  # the server's own log on our stderr (posttrain serve)
            self.process = subprocess.Popen(
                command,
                stdout=2,
                stdin=subprocess.DEVNULL,  # fd 2: our stderr
                env=self._environment(libdir),
                preexec_fn=_die_with_parent(),
            )
        else:
            self.log_path = self.log_path or os.path.join(self._tmp, "server.log")
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self._environment(libdir),
                    preexec_fn=_die_with_parent(),
                )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        wait_ready(self.url, timeout_s, f"tritonserver was not ready on {self.url} after {timeout_s:.0f} s:\n", self)

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path in (None, "-"):
            return "(the server's log is above)" if self.log_path else ""
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")
        return ""

    def client(self, timeout_s: float = 120.0):
        """A tritonclient HTTP client; closed by :meth:`stop` (an open one makes shutdown wait)."""
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(
            url=self.url.split("://", 1)[1], connection_timeout=timeout_s, network_timeout=timeout_s
        )
        self._clients.append(client)
        return client

    def wait(self) -> int:
        """Block until the server exits (Ctrl-C / SIGTERM reach :meth:`stop` through the caller)."""
        return self.process.wait()

    def stop(self) -> int | None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)  # graceful: unload models, stop the stubs
                try:
                    self.process.wait(timeout=self.exit_timeout_s + 10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            code = self.process.returncode
        if self._tmp:
            if self.log_path and self.log_path.startswith(self._tmp):
                self.log_path = None
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return code

    def __enter__(self) -> TritonServer:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def model_states(self) -> list[dict]:
        """``/v2/repository/index``: every model and version the server knows, with its state."""
        return model_states(self.url)


def model_states(url: str) -> list[dict]:
    """``/v2/repository/index`` of the Triton server at ``url``: every model and version, with its state."""
    import json

    req = urllib.request.Request(f"{url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@dataclass(frozen=True)
class RunningServer:
    """A Triton server started elsewhere (a container, a cluster's Service), reached at ``url``."""

    url: str

    def model_states(self) -> list[dict]:
        return model_states(self.url)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until ``/v2/health/ready`` answers 200 (every model given to --load-model is loaded)."""
        wait_ready(self.url, timeout_s, f"no ready Triton server at {self.url} after {timeout_s:.0f} s")


def wait_ready(url: str, timeout_s: float, not_ready: str, started: TritonServer | None = None) -> None:
    """Poll ``url``'s ``/v2/health/ready`` until it answers 200; after ``timeout_s``, TritonServerError with
    ``not_ready`` (and the log tail of the server we ``started``, which fails at once if that process exits)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if started is not None and started.process.poll() is not None:
            raise TritonServerError(
                f"tritonserver exited with code {started.process.returncode} before it was ready:\n{started.log_tail()}"
            )
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        if time.monotonic() > deadline:
            raise TritonServerError(not_ready + (started.log_tail() if started is not None else ""))
        time.sleep(0.1)
