from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from falcon import testing

from api.app import create_app
from pipeline.settings import Settings
from pipeline.state.store import Store
from tests.conftest import free_port, kill_group, stop_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


def job_body(**overrides: Any) -> dict[str, Any]:
    return {"kind": "image", "workflow": WORKFLOW, "outputs": 1, **overrides}


@pytest.fixture
def client(settings: Settings, store: Store) -> testing.TestClient:
    return testing.TestClient(create_app(settings, store=store))


@pytest.fixture
def submit(client: testing.TestClient) -> Callable[..., testing.Result]:
    def post(api_key: str, key: str | None = "intent-1", body: Any = None, **kw: Any) -> testing.Result:
        headers = {"Authorization": f"Bearer {api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return client.simulate_post("/v1/jobs", json=job_body() if body is None else body, headers=headers, **kw)

    return post


def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


class Web:
    """The API under gunicorn with ops/gunicorn.conf.py on a free loopback port, stopped by its PID.

    HOME is private to the test and XDG_RUNTIME_DIR unset, so anything gunicorn would create at a
    per-user default path (its control socket) lands where the test can see it.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.log = tmp_path / "gunicorn.log"
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        self.env = env | {"PORT": str(self.port), "HOME": str(self.home),
                          "RECKON_BLOB_DIR": str(tmp_path / "blobs")}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    #: What gunicorn serves, and the path that answers 200 once it is ready.
    argv = ("-c", "ops/gunicorn.conf.py", "api.app:create_app()")
    ready_path = "/readyz"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "gunicorn"), *self.argv],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self._ready(), timeout=20)

    def stop(self, graceful: bool = True) -> None:
        """The group gunicorn's master (this PID) leads: SIGTERM and a wait, or (``graceful=False``, a
        finished test's) SIGKILL at once."""
        (stop_group if graceful else kill_group)(self.proc)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
        try:
            return self.request("GET", self.ready_path)[0] == 200
        except OSError:
            return False

    def request(self, method: str, path: str, body: bytes | Iterable[bytes] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request; an iterable body goes out chunked (Transfer-Encoding, no Content-Length)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()


@pytest.fixture
def web(redis_client, tmp_path: Path) -> Iterator[Web]:
    server = Web(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop(graceful=False)


class Chromium:
    """Debian's headless chromium with the DevTools protocol on a free loopback port, stopped by its PID."""

    def __init__(self, tmp_path: Path) -> None:
        exe = shutil.which("chromium")
        if exe is None:
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium package)")
        self.port = free_port()
        self.log = tmp_path / "chromium.log"
        self.args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--disable-extensions",
                     f"--user-data-dir={tmp_path / 'chromium-profile'}", "--remote-debugging-address=127.0.0.1",
                     f"--remote-debugging-port={self.port}", "about:blank"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._ready, timeout=30, interval=0.1)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(f"{self.endpoint}/json/version", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop_group(self.proc)  # the group this PID leads: its zygote and renderers too


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Chromium]:
    browser = Chromium(tmp_path)
    try:
        browser.start()
        yield browser
    finally:
        browser.stop()


class Streams(Web):
    """The streams process (api/streams/, ops/streams.conf.py: uvicorn workers) on a free loopback port."""

    argv = ("-c", "ops/streams.conf.py", "api.streams.app:create_app()")
    ready_path = "/healthz"

    def __init__(self, tmp_path: Path, **env: str) -> None:
        super().__init__(tmp_path)
        self.env |= {"RECKON_STREAMS_PORT": str(self.port), **env}


@pytest.fixture
def streams(redis_client, tmp_path: Path) -> Iterator[Streams]:
    server = Streams(tmp_path, RECKON_STREAMS_PING_SECONDS="1")
    try:
        server.start()
        yield server
    finally:
        server.stop(graceful=False)
