"""The scripts' Redis Functions library: its name follows its whole source; loading asks first."""

from __future__ import annotations

import pytest
import redis

from pipeline.state import scripts as scripts_module
from pipeline.state.scripts import Scripts
from tests.conftest import REDIS_PORT


@pytest.fixture
def client(redis_server: str):
    client = redis.Redis(port=REDIS_PORT, decode_responses=True)
    yield client
    client.config_set("maxmemory", 0)
    client.close()


def test_a_change_of_the_wrapper_alone_is_another_library(client, monkeypatch) -> None:
    old = Scripts(client)
    monkeypatch.setattr(scripts_module, "_LIBRARY", scripts_module._LIBRARY + "-- the next release\n")
    new = Scripts(client)
    assert new.library != old.library
    new.load()
    old.load()  # both versions side by side: neither replaces the other
    names = {dict(zip(e[::2], e[1::2], strict=True))["library_name"] for e in client.function_list()}
    assert {old.library, new.library} <= names
    client.function_delete(new.library)


def test_a_full_server_that_has_the_library_is_ready(client) -> None:
    scripts = Scripts(client)
    scripts.load()
    client.config_set("maxmemory", 1)  # every write refused from here on
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("reckon:test:full", "1")
    scripts.load()  # asks first: nothing to load, nothing refused
    client.function_delete(scripts.library)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        scripts.load()  # a full server that lacks it refuses it, as it refuses any write
