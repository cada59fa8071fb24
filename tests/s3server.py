"""A real S3-compatible server for tests: moto in server mode, its own process on a free loopback port.

Debian 12 packages no S3 server that runs alone here (docs/operations.md "Blob store" says which were
considered), so the tests speak HTTP to moto's server, started and stopped by PID.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests.conftest import free_port, stop_group, wait_until

#: boto3's ordinary variables, as a deployment would set them; the secret must never reach a log.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "reckon-test-key-id",
    "AWS_SECRET_ACCESS_KEY": "reckon-test-secret-5f0c2e",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_names = itertools.count(1)


def client(endpoint: str, **config: Any) -> Any:
    """A client with the test credentials given explicitly (the store's own reads the environment)."""
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        config=Config(s3={"addressing_style": "path"}, **config))


class S3Server:
    def __init__(self, endpoint: str, proc: subprocess.Popen[bytes]) -> None:
        self.endpoint, self.proc = endpoint, proc

    def client(self, **config: Any) -> Any:
        return client(self.endpoint, **config)

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"reckon-blobs-{next(_names)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        return sorted(obj["Key"] for obj in self.client().list_objects_v2(Bucket=bucket).get("Contents", []))


@contextmanager
def running(logs: Path) -> Iterator[S3Server]:
    port = free_port()
    with open(logs / "moto.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", proc)
    try:
        wait_until(lambda: _answers(server), timeout=30, interval=0.1)
        yield server
    finally:
        stop_group(proc)


def _answers(server: S3Server) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError(f"moto's server exited with {server.proc.returncode}")
    try:
        server.client(connect_timeout=1, retries={"max_attempts": 1}).list_buckets()
        return True
    except Exception:
        return False
