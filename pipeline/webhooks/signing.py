"""Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` headers.

The signature is ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`` keyed by the secret's bytes
(``whsec_<base64>``); while a rotated secret's overlap lasts, the header carries one signature per
secret, space separated, so a receiver holding either verifies (https://www.standardwebhooks.com).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
#: Bytes of a new secret (the specification asks for 24 to 64).
SECRET_BYTES = 32


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of the message under ``secret``."""
    key = base64.b64decode(secret.removeprefix(PREFIX))
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secrets_: list[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one message, signed with each of ``secrets_`` (newest first)."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(secret, message_id, timestamp, body) for secret in secrets_),
    }
