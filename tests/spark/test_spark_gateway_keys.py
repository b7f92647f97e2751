"""A fleet that checks who wrote each batch (``cairn spark ingest --gateway-keys``): the
gateway's ``cairn sync`` signs every manifest with its own key and ``--show-key`` prints the
line for the fleet's keys file; the ingest takes what a listed key of the batch's gateway
signed and quarantines the rest with the reason, whatever folder it landed in. The
signature's own rules are in tests/pure/test_batch_signature.py."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from cairn.formats.batch import manifest_name  # noqa: E402
from cairn.sync.uploader import build_batch  # noqa: E402
from tests.spark.test_spark import events, keys, land  # noqa: E402
from tests.system.test_sync import GATEWAY, fill_store  # noqa: E402

pytestmark = pytest.mark.spark


def sync_config(tmp_path, data_dir, landing, extra: str = ""):
    path = tmp_path / "cairn.toml"
    path.write_text(f'[router]\ndata_dir = "{data_dir}"\n\n[sync]\nsink = "dir:{landing}"\n'
                    f'gateway_id = "{GATEWAY}"\n{extra}')
    return path


def test_only_batches_their_gateway_signed_are_ingested(spark, tmp_path, capsys, cairn_cli):
    data_dir, landing, table = tmp_path / "data", tmp_path / "landing", tmp_path / "table"
    seqs = fill_store(data_dir, 50)
    config = sync_config(tmp_path, data_dir, landing, "batch_events = 20\n")
    assert cairn_cli(["sync", "--config", str(config), "--show-key"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"{GATEWAY} ed25519:") and line.count("\n") == 1
    (tmp_path / "fleet-keys").write_text(f"# our gateways\n{line}")
    assert cairn_cli(["sync", "--config", str(config), "--once"]) == 0
    # in the gateway's own folder: one batch unsigned, one signed by another gateway's key
    unsigned = land(landing, GATEWAY, events(range(1001, 1011)), 1000)
    forged = build_batch(GATEWAY, events(range(2001, 2011)), 2000, [], [],
                         signing_key=Ed25519PrivateKey.generate())
    (landing / forged.name).write_bytes(forged.data)
    (landing / manifest_name(forged.name)).write_text(json.dumps(forged.manifest))

    assert cairn_cli(["spark", "ingest", "--landing", str(landing), "--table", str(table),
                      "--quarantine", str(tmp_path / "q"), "--gateway-keys",
                      str(tmp_path / "fleet-keys"), "--master", "local[2]"]) == 0
    printed = capsys.readouterr().out
    assert "5 manifests: 3 batches ingested (3 in one pass), 0 already in the table, " \
           "2 quarantined; 50 rows read, 50 added" in printed
    assert f"quarantined {unsigned.name}: the manifest is not signed, and " in printed
    assert f"quarantined {forged.name}: signed by ed25519:" in printed
    assert [seq for _, seq in keys(spark, table)] == seqs  # all of the gateway's, no other


def test_the_store_s_batches_keep_their_signature_from_one_run_to_the_next(tmp_path, capsys,
                                                                          cairn_cli):
    """The key is made once, in the data directory: a restarted sync signs with the same."""
    data_dir = tmp_path / "data"
    fill_store(data_dir, 1)
    config = sync_config(tmp_path, data_dir, tmp_path / "landing")
    assert cairn_cli(["sync", "--config", str(config), "--show-key"]) == 0
    first = capsys.readouterr().out
    assert cairn_cli(["sync", "--config", str(config), "--once"]) == 0
    manifest = json.loads(next((tmp_path / "landing" / GATEWAY).glob("*.manifest.json"))
                          .read_text())
    assert manifest["signature"]["key"] == first.split()[1]


def test_a_keys_file_that_cannot_be_read_stops_the_ingest_before_it_starts(tmp_path, capsys,
                                                                          cairn_cli):
    bad = tmp_path / "fleet-keys"
    bad.write_text("gw-a ed25519:AAAA\n")
    assert cairn_cli(["spark", "ingest", "--landing", "x", "--table", "y",
                      "--gateway-keys", str(bad)]) == 2
    assert capsys.readouterr().err == (f"cairn spark ingest: --gateway-keys: {bad} line 1: "
                                       "'ed25519:AAAA': an Ed25519 key is 32 bytes, not 3\n")
