"""reckon's signatures verified by the Standard Webhooks reference verifier (the ``standardwebhooks``
package), with the secret a rotation replaced as well as the new one."""

from __future__ import annotations

import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from pipeline.webhooks import signing


def test_the_reference_verifier_accepts_each_secret_of_a_rotation_and_nothing_tampered() -> None:
    new, old = signing.new_secret(), signing.new_secret()
    assert new.startswith("whsec_") and new != old
    body = b'{"type":"job.completed","data":{"id":"acme.1"}}'
    headers = signing.headers([new, old], "msg_acme.1.3", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):
        assert Webhook(secret).verify(body, headers)["type"] == "job.completed"
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body.replace(b"acme.1", b"acme.2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body, {**headers, "webhook-id": "msg_acme.1.4"})
