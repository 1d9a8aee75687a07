"""An S3-compatible server on 127.0.0.1 for the remote-cache tests and benchmarks.

``S3Server`` runs moto's standalone server (``moto[s3]`` and flask, dev dependencies) as a child
process on a free port; the client (obstore, the ``remote`` extra) reaches it exactly as
it would reach AWS or MinIO: through ``AWS_ENDPOINT_URL``, keys, region and
``AWS_ALLOW_HTTP`` in the environment. ``stop()``/``start()`` on the same port simulate
an outage (connection refused) without forgetting the port; moto keeps its objects in
memory, so a restarted server is empty.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from refenv import skip_or_fail

ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_SESSION_TOKEN",
)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 server as a child process on ``127.0.0.1:port``."""

    def __init__(self, port: int | None = None, *, enforce_auth: bool = False) -> None:
        self.port = port or free_port()
        self.enforce_auth = enforce_auth
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it answers (at most 30 s)."""
        env = dict(os.environ)
        if self.enforce_auth:
            # Every request must be signed with keys moto's IAM knows: none are, so 403.
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).read()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto server did not start within 30 s")

    def stop(self) -> None:
        """Stop the server (its port refuses connections afterwards)."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def env(self) -> dict[str, str]:
        """The client environment for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (with boto3, which moto depends on)."""
        import boto3

        env = self.env()
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        ).create_bucket(Bucket=name)


@contextmanager
def client_env(values: dict[str, str]) -> Iterator[None]:
    """Set the client environment (and unset other AWS_* keys) for the duration."""
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    for k in ENV_KEYS:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def require_remote_packages() -> None:
    """Skip (fail under CI) when moto or obstore is missing: they are dev dependencies."""
    try:
        import moto.server  # noqa: F401
        import obstore  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"the remote tests need moto[s3], flask and obstore (uv sync): {exc}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server for the session."""
    require_remote_packages()
    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: Any) -> Iterator[str]:
    """A fresh bucket on the session server, with the client environment set; yields
    ``s3://<bucket>``."""
    name = "t" + format(abs(hash(request.node.nodeid)) % 10**12, "012d")
    s3_server.create_bucket(name)
    with client_env(s3_server.env()):
        yield f"s3://{name}"


class SlowProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port`` that passes server-to-client
    bytes at about ``bytes_per_second`` per connection (a slow server, as the client
    sees it). Threads; ``close()`` stops accepting."""

    def __init__(self, target_port: int, bytes_per_second: int) -> None:
        import threading

        self.target_port = target_port
        self.rate = bytes_per_second
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                # The server is down: the client sees its connection closed, as it
                # would without the proxy, and later connections are still served.
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, self.rate), daemon=True
            ).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, rate: int) -> None:
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                dst.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()
