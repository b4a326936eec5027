"""Signed tracker requests verify only for their method, bytes, key and time window."""

import pytest

from meshnet.identity import requests
from meshnet.identity.keys import Identity

KEY = Identity.generate()
NOW = 1_800_000_000_000


def test_a_signed_request_names_its_caller():
    metadata = requests.sign_request(KEY, "tok", "Register", b"body", unix_ms=NOW)
    assert requests.verify_request(metadata, "Register", b"body", now_ms=NOW + 1000) == KEY.public_key
    assert requests.bearer_token(metadata) == "tok"


@pytest.mark.parametrize("method,body,now", [
    ("Drain", b"body", NOW),  # replayed to another method
    ("Register", b"bodx", NOW),  # other bytes
    ("Register", b"body", NOW + requests.MAX_SKEW_MS + 1),  # too old
    ("Register", b"body", NOW - requests.MAX_SKEW_MS - 1),  # from the future
])
def test_anything_else_is_refused(method, body, now):
    metadata = requests.sign_request(KEY, "tok", "Register", b"body", unix_ms=NOW)
    with pytest.raises(requests.RequestAuthError):
        requests.verify_request(metadata, method, body, now_ms=now)


def test_missing_or_malformed_metadata_is_refused():
    good = dict(requests.sign_request(KEY, "tok", "Register", b"body", unix_ms=NOW))
    for drop in (requests.KEY_METADATA, requests.TIME_METADATA, requests.SIGNATURE_METADATA):
        with pytest.raises(requests.RequestAuthError):
            requests.verify_request([(k, v) for k, v in good.items() if k != drop], "Register", b"body", now_ms=NOW)
    with pytest.raises(requests.RequestAuthError):
        requests.verify_request({**good, requests.SIGNATURE_METADATA: "!!"}.items(), "Register", b"body", now_ms=NOW)
