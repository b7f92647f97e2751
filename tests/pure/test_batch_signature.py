"""Batches signed by their gateway (``formats.batch_signature``): the uploader signs each
manifest with the gateway's own Ed25519 key, and the central job, given the fleet's keys
file, takes only what a listed key of the manifest's gateway signed. Its use by a real
ingest is in tests/spark/test_spark_gateway_keys.py."""

from __future__ import annotations

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cairn.central.plan import Candidate, triage
from cairn.formats.batch import parse_manifest
from cairn.formats.batch_signature import GatewayKeys, gateway_key, public_text
from cairn.sync.uploader import build_batch
from harness.readings import readings

GATEWAY = "gw-a"


def signed_manifest(key: Ed25519PrivateKey, gateway: str = GATEWAY, first_seq: int = 1) -> dict:
    """A batch's manifest as the uploader writes it and the job parses it back."""
    batch = build_batch(gateway, readings(1, 5, first_seq=first_seq), first_seq - 1, [], [],
                        signing_key=key)
    return parse_manifest(json.dumps(batch.manifest))


def fleet(*lines: str) -> GatewayKeys:
    return GatewayKeys.parse("\n".join(lines), "fleet-keys")


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def keys(key) -> GatewayKeys:
    return fleet(f"{GATEWAY} {public_text(key.public_key())}")


def test_a_manifest_signed_by_its_gateway_s_listed_key_is_vouched_for(key, keys):
    assert keys.problem(signed_manifest(key)) is None


def test_a_gateway_may_have_a_new_key_listed_beside_its_old_one(key):
    new = Ed25519PrivateKey.generate()
    both = fleet(f"{GATEWAY} {public_text(key.public_key())}  # the old card",
                 f"{GATEWAY} {public_text(new.public_key())}")
    assert both.problem(signed_manifest(key)) is None
    assert both.problem(signed_manifest(new)) is None


def test_a_manifest_changed_after_it_was_signed_is_refused(key, keys):
    manifest = signed_manifest(key) | {"count": 4}
    assert keys.problem(manifest) == ("the signature of gateway 'gw-a' does not match its "
                                      "manifest (changed after it was signed)")


def test_another_data_file_under_the_signed_manifest_is_refused(key, keys):
    """The signature covers the data file through the manifest's sha256."""
    manifest = signed_manifest(key) | {"sha256": "0" * 64}
    assert "does not match its manifest" in keys.problem(manifest)


def test_a_batch_signed_by_a_key_not_listed_for_its_gateway_is_refused(keys):
    stranger = Ed25519PrivateKey.generate()
    problem = keys.problem(signed_manifest(stranger))
    assert problem.startswith("signed by ed25519:") and \
        problem.endswith("which fleet-keys does not list for gateway 'gw-a'")


def test_one_gateway_s_key_does_not_vouch_for_another_gateway(key):
    """The forged batch of the red-team round: another gateway's (valid) key, landed under
    the victim's name."""
    other = Ed25519PrivateKey.generate()
    keys = fleet(f"{GATEWAY} {public_text(key.public_key())}",
                 f"gw-b {public_text(other.public_key())}")
    assert "does not list for gateway 'gw-a'" in keys.problem(signed_manifest(other))


def test_an_unsigned_manifest_or_an_unlisted_gateway_is_refused(key, keys):
    unsigned = {k: v for k, v in signed_manifest(key).items() if k != "signature"}
    assert keys.problem(unsigned) == "the manifest is not signed, and fleet-keys lists gateway " \
                                     "'gw-a'"
    assert keys.problem(signed_manifest(key, "gw-x")) == "gateway 'gw-x' has no key in fleet-keys"


@pytest.mark.parametrize("signature", ["AAAA", {"key": 1, "value": "x"}, {"key": "ed25519:x"}])
def test_a_signature_field_that_is_no_signature_is_refused(key, keys, signature):
    assert keys.problem(signed_manifest(key) | {"signature": signature}) == \
        "manifest field 'signature' is not an object of a key and a value"


def test_a_signature_value_that_is_not_base64_is_a_mismatch(key, keys):
    manifest = signed_manifest(key)
    manifest["signature"] = manifest["signature"] | {"value": "not base64!"}
    assert "does not match its manifest" in keys.problem(manifest)


@pytest.mark.parametrize("line, says", [
    ("gw-a", "line 2: want a gateway id and its key"),
    ("gw-a ssh-ed25519 AAAA", "line 2: 'ssh-ed25519' is not an ed25519:BASE64 key"),
    ("gw-a ed25519:%%%", "line 2: 'ed25519:%%%': the key is not base64"),
    ("gw-a ed25519:AAAA", "line 2: 'ed25519:AAAA': an Ed25519 key is 32 bytes, not 3"),
])
def test_a_keys_file_line_that_is_no_key_is_an_error_naming_its_line(line, says):
    with pytest.raises(ValueError) as error:
        fleet("# the fleet", line)
    assert str(error.value) == f"fleet-keys {says}"


def test_the_gateway_makes_its_key_once_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "signing.key"
    made = gateway_key(path, owner_like=tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = gateway_key(path)
    assert public_text(again.public_key()) == public_text(made.public_key())


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file away: root only")
def test_a_key_root_makes_for_the_gateway_belongs_to_the_data_directory_s_owner(tmp_path):
    """``cairn sync --show-key`` run as root, before cairn-sync (the cairn user) ever ran."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    os.chown(data_dir, 4321, 4322)
    gateway_key(data_dir / "signing.key", owner_like=data_dir)
    made = (data_dir / "signing.key").stat()
    assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (4321, 4322, 0o600)


def test_a_key_file_holding_something_else_is_an_error_not_a_new_key(tmp_path):
    path = tmp_path / "signing.key"
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError):
        gateway_key(path)
    assert path.read_bytes() == b"garbage"


def test_triage_refuses_a_batch_its_gateway_did_not_sign_before_anything_else(key, keys):
    """Even a manifest naming a batch the table holds (same file and sha256): a forged
    manifest could carry other anchors and gaps."""
    good = signed_manifest(key, first_seq=6)
    forged = signed_manifest(Ed25519PrivateKey.generate())
    parsed = [Candidate(f"{m['file']}.manifest.json", m["file"], m, "file:/" + m["file"])
              for m in (good, forged)]
    candidates, already, rejected = triage(parsed, {(forged["file"], forged["sha256"])},
                                           lambda c: True, keys)
    assert [c.manifest for c in candidates] == [good] and already == []
    assert [c.manifest for c, _ in rejected] == [forged]
