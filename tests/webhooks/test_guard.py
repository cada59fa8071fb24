"""The webhook request against a real receiver process: private addresses refused (after resolution and at
every redirect), redirects not followed unless allowed, answers read up to a bound, a timeout kept."""

from __future__ import annotations

import time

import pytest

from pipeline.webhooks import guard

from .conftest import Receiver


def names(table: dict[str, list[str]]) -> guard.Resolve:
    return lambda host, port: table[host]


def only_loopback(address: str) -> bool:
    return address == "127.0.0.1"


def test_the_rule_refuses_every_kind_of_private_address() -> None:
    for address in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "169.254.169.254", "100.64.0.1",
                    "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "0.0.0.0", "224.0.0.1", "192.0.0.8",
                    "64:ff9b::a9fe:a9fe", "64:ff9b::a00:5", "::a9fe:a9fe", "2002:a9fe:a9fe::1", "fec0::1"):
        assert not guard.allowed(address, allow_private=False), address
        assert guard.allowed(address, allow_private=True)
    assert guard.allowed("8.8.8.8", allow_private=False) and guard.allowed("2606:4700::1111", allow_private=False)


def test_a_loopback_receiver_is_not_sent_to_unless_allowed(receiver: Receiver) -> None:
    with pytest.raises(guard.Refused):
        guard.post(f"{receiver.url}/hook", b"{}", {}, timeout=5, allow_private=False)
    assert receiver.received() == []
    answer = guard.post(f"{receiver.url}/hook", b"{}", {}, timeout=5, allow_private=True)
    assert answer.status == 200 and len(receiver.received()) == 1


def test_a_name_is_refused_when_any_address_it_resolves_to_is_private(receiver: Receiver) -> None:
    resolver = names({"hook.test": ["8.8.8.8", "10.0.0.5"]})
    with pytest.raises(guard.Refused, match="private"):
        guard.post(f"http://hook.test:{receiver.port}/", b"{}", {}, timeout=5, allow_private=False, resolver=resolver)
    assert receiver.received() == []


def test_a_redirect_is_not_followed_by_default(receiver: Receiver) -> None:
    receiver.plan(f"307:{receiver.url}/second")
    answer = guard.post(f"{receiver.url}/first", b"{}", {}, timeout=5, allow_private=True)
    assert answer.status == 307 and [r["path"] for r in receiver.received()] == ["/first"]


def test_each_redirect_target_is_checked_like_the_first(receiver: Receiver) -> None:
    resolver = names({"hook.test": ["127.0.0.1"], "inner.test": ["10.1.2.3"]})
    receiver.plan(f"307:http://inner.test:{receiver.port}/inner")
    with pytest.raises(guard.Refused):
        guard.post(f"http://hook.test:{receiver.port}/first", b"{}", {}, timeout=5, allow_private=False,
                   max_redirects=1, resolver=resolver, allow=only_loopback)
    receiver.plan(f"307:http://hook.test:{receiver.port}/second")
    answer = guard.post(f"http://hook.test:{receiver.port}/first", b"{}", {}, timeout=5, allow_private=False,
                        max_redirects=1, resolver=resolver, allow=only_loopback)
    assert answer.status == 200
    assert [r["path"] for r in receiver.received()] == ["/first", "/first", "/second"]
    assert receiver.received()[-1]["headers"]["host"] == f"hook.test:{receiver.port}"


def test_an_answer_is_read_up_to_its_bound_and_a_slow_one_times_out(receiver: Receiver) -> None:
    receiver.plan("big", "timeout", "drip")
    answer = guard.post(receiver.url, b"{}", {}, timeout=5, allow_private=True)
    assert answer.status == 200 and len(answer.body) == guard.MAX_RESPONSE_BYTES
    with pytest.raises(TimeoutError):
        guard.post(receiver.url, b"{}", {}, timeout=0.5, allow_private=True)
    started = time.monotonic()
    with pytest.raises(TimeoutError):  # each byte came within a read's timeout; the whole did not
        guard.post(receiver.url, b"{}", {}, timeout=1.0, allow_private=True)
    assert time.monotonic() - started < 5  # the drip lasts 25 s: the request was cut, not waited out


def test_urls_that_cannot_be_requested_are_refused() -> None:
    for url in ("ftp://example.com/", "http://user:pw@example.com/", "http:///path", "http://exa mple.com/",
                "http://example.com:99999/", "https://example.com/\u00e9", "http://example.com:0/"):
        with pytest.raises(guard.Refused):
            guard.check_url(url)


def test_an_address_in_any_spelling_is_refused_at_registration() -> None:
    from pipeline.errors import InvalidRequest
    from pipeline.webhooks.endpoints import check

    for url in ("http://127.1/", "http://2130706433/", "http://0x7f000001/", "http://localhost./",
                "http://[64:ff9b::a9fe:a9fe]/", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(InvalidRequest):
            check(url, ["job.completed"], allow_private=False)
    assert check("https://hooks.example.com/x", ["job.failed"], allow_private=False)[0] == \
        "https://hooks.example.com/x"
