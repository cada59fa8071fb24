"""The API as deployed: gunicorn with ops/gunicorn.conf.py, spoken to over a socket."""

from __future__ import annotations

import runpy
import socket
import time

import orjson
from gunicorn.config import Config

from pipeline.state.keys import TenantKeys

from .conftest import ROOT, job_body

P = "urn:reckon:problem:"


def headers(api_key: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key, "Content-Type": "application/json"}


def test_a_chunked_body_is_read_within_the_size_limit(web, tenant, store) -> None:
    api_key = tenant()
    data = orjson.dumps(job_body(outputs=2))
    status, _, body = web.request("POST", "/v1/jobs", [data[:10], data[10:]], headers(api_key, "chunked-1"))
    assert status == 202, body
    job = orjson.loads(body)
    assert (job["outputs_requested"], job["cost"]["ceiling"]) == (2, 60)
    chunk = b" " * 65_536
    too_large = [b"{"] + [chunk] * 8 + [b"}"]  # 512 KiB of white space and two braces: over the limit
    status, _, body = web.request("POST", "/v1/jobs", too_large, headers(api_key, "chunked-2"))
    assert (status, orjson.loads(body)["type"]) == (413, P + "payload-too-large")
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1


def test_gunicorn_opens_no_control_socket_at_the_shared_default_path(web) -> None:
    cfg = Config()  # the settings gunicorn reads from ops/gunicorn.conf.py
    for name, value in runpy.run_path(str(ROOT / "ops" / "gunicorn.conf.py")).items():
        if name in cfg.settings:
            cfg.set(name, value)
    assert cfg.control_socket_disable is True
    time.sleep(0.5)  # the master opens the socket in a thread once its workers run
    assert web.request("GET", "/healthz")[0] == 200
    assert list(web.home.rglob("*")) == []  # gunicorn >= 25.1 would create ~/.gunicorn/gunicorn.ctl


def cut_short(web, api_key: str, head: str, sent: bytes) -> tuple[int, dict]:
    """POST /v1/inputs with ``head``'s framing header, send ``sent``, stop sending (half-close), read the answer."""
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as conn:
        conn.sendall(f"POST /v1/inputs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n"
                     f"Content-Type: image/png\r\n{head}\r\n\r\n".encode() + sent)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65_536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, orjson.loads(answer.partition(b"\r\n\r\n")[2] or b"{}")


def test_an_upload_whose_client_stops_sending_is_a_400_and_records_nothing(web, tenant, store) -> None:
    """A body shorter than its Content-Length, or chunked and cut before its last chunk: the bytes that came
    are not the file (gunicorn hands the application what arrived), so nothing is stored nor counted."""
    api_key = tenant()
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    status, problem = cut_short(web, api_key, f"Content-Length: {len(png) + 500}", png)
    assert (status, problem.get("type")) == (400, P + "input-incomplete")
    status, problem = cut_short(web, api_key, "Transfer-Encoding: chunked", b"%x\r\n%s\r\n" % (len(png), png))
    assert (status, problem.get("type")) == (400, P + "input-incomplete")
    assert store.redis.hgetall(TenantKeys("acme").inputs) == {}
