"""``cairn provision``: the boot partition's cairn/ folder, applied all or nothing.

Real files in a temporary folder standing for the FAT partition, /etc/cairn and /data; real
``ssh-keygen`` and ``openssl``; Cairn's own config checks. Each test runs the command."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from cairn.app import cli
from cairn.app.network_profiles import profile_uuid
from cairn.gateway.ops.config_history import History

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "images/config"
NM = "etc/NetworkManager/system-connections"

WIFI = """type = "wifi"
ssid = "Greenhouse"
passphrase = "correct horse battery"
country = "de"
"""
CELLULAR = """type = "cellular"
apn = "internet"
pin = "1234"
"""
ETHERNET = """type = "ethernet"
dhcp = false
address = "192.168.7.20/24"
gateway = "192.168.7.1"
dns = ["192.168.7.1"]
"""


@pytest.fixture
def device(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("boot", "etc", "data")}
    for path in paths.values():
        path.mkdir()
    paths["folder"] = paths["boot"] / "cairn"
    paths["folder"].mkdir()
    (paths["folder"] / "boot.env").write_bytes(b"\x12\x34uboot state\0\0")
    (paths["folder"] / "bootargs.env").write_text("cairn_cmdline=console=ttyS1,115200\n")
    paths["key"] = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", paths["key"]],
                   check=True)
    return paths


def history_outcome(etc: Path) -> str:
    return (etc / "provisioning.json").read_text()


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def cairn_toml(device: dict[str, Path]) -> str:
    """The shipped config with a sync sink whose token is one of the folder's secrets."""
    return (SHIPPED / "cairn.toml").read_text() + (
        f'\n[sync]\nsink = "dir:{device["data"]}/sink"\n'
        f'token_file = "{device["etc"]}/secrets/sync-token"\n')


def complete_folder(device: dict[str, Path]) -> Path:
    folder = device["folder"]
    write(folder, "cairn.toml", cairn_toml(device))
    write(folder, "secrets/sync-token", "a-sync-token-of-some-length\n")
    write(folder, "sensors/greenhouse.toml",
          (SHIPPED / "sensors/example.toml.sample").read_text())
    write(folder, "mqtt/local.toml", (SHIPPED / "mqtt/example.toml.sample").read_text())
    write(folder, "authorized_keys", "# the site's laptop\r\n" +
          Path(f"{device['key']}.pub").read_text().replace("\n", "\r\n"))
    write(folder, "hostname", "greenhouse-7\r\n")
    write(folder, "network/wifi.toml", WIFI)
    write(folder, "network/lte.toml", CELLULAR)
    return folder


def provision(device: dict[str, Path], *more: str) -> int:
    return cli.main(["provision", "--from", str(device["folder"]), "--etc", str(device["etc"]),
                     "--data", str(device["data"]), *more])


def report(device: dict[str, Path]) -> str:
    return (device["folder"] / "report.txt").read_bytes().decode().replace("\r\n", "\n")


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_complete_folder_is_applied_and_emptied_of_its_inputs(device):
    folder = complete_folder(device)
    assert provision(device) == 0
    etc, data = device["etc"], device["data"]
    assert (etc / "cairn.toml").read_text() == cairn_toml(device)
    assert (etc / "sensors/greenhouse.toml").is_file() and (etc / "mqtt/local.toml").is_file()
    assert (data / "etc/hostname").read_text() == "greenhouse-7\n"
    assert (data / "etc/ssh/authorized_keys").read_text() == \
        Path(f"{device['key']}.pub").read_text()
    assert (data / "etc/cairn/wifi-country").read_text() == "DE\n"
    assert {p.name for p in (data / NM).iterdir()} == \
        {"cairn-wifi.nmconnection", "cairn-lte.nmconnection"}
    assert sorted(p.name for p in folder.iterdir()) == ["boot.env", "bootargs.env",
                                                        "report.txt"]


def test_the_report_lists_what_was_applied_and_no_secret(device):
    complete_folder(device)
    provision(device)
    text = report(device)
    assert "APPLIED" in text and "boot " in text
    for name in ("cairn.toml", "secrets/sync-token", "sensors/greenhouse.toml",
                 "mqtt/local.toml", "authorized_keys", "hostname", "network/wifi.toml",
                 "network/lte.toml", "SHA256:"):
        assert name in text
    for secret in ("a-sync-token-of-some-length", "correct horse battery", "1234"):
        assert secret not in text
    assert b"\r\n" in (device["folder"] / "report.txt").read_bytes()  # for Notepad


def test_secrets_and_keyfiles_are_readable_by_their_owners_only(device):
    complete_folder(device)
    provision(device)
    assert stat.S_IMODE((device["etc"] / "secrets/sync-token").stat().st_mode) == 0o640
    for keyfile in (device["data"] / NM).iterdir():
        assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600


BAD_INPUTS = {
    "garbage": ("cairn.toml", b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage", "cairn.toml: -: not UTF-8"),
    "not_toml": ("cairn.toml", "[router\nlisten = 8080\n", "cairn.toml: -: invalid TOML"),
    "not_a_key": ("authorized_keys", "ssh-ed25519 AAAAnotakey laptop\n",
                  "authorized_keys: line 1: not an SSH public key"),
    "hostname_with_spaces": ("hostname", "green house 7\n", "hostname: -: has spaces"),
    "unknown_network_type": ("network/radio.toml", 'type = "lora"\n',
                             "network/radio.toml: type: unknown type 'lora'"),
    "unknown_network_key": ("network/wifi.toml", WIFI + 'band = "5GHz"\n',
                            "network/wifi.toml: band: unknown key"),
    "network_remove_with_a_profile": ("network/wifi.toml", WIFI + "remove = true\n",
                                      "network/wifi.toml: country: not with remove = true"),
    "network_remove_false": ("network/wifi.toml", "remove = false\n",
                             "network/wifi.toml: remove: only remove = true"),
    "bad_sensor": ("sensors/greenhouse.toml", '[[sensors]]\nid = "x"\nkind = "teapot"\n',
                   "sensors/greenhouse.toml: sensors[0]"),
    "config_naming_a_missing_secret": (
        "cairn.toml", '[[realms]]\nname = "realm1"\n[sync]\nsink = "dir:/x"\n'
                      'token_file = "/etc/cairn/secrets/missing"\n',
        "cairn.toml: sync.token_file: cannot read /etc/cairn/secrets/missing"),
}


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_a_bad_input_is_named_and_nothing_is_applied(device, bad):
    name, content, expected = BAD_INPUTS[bad]
    folder = complete_folder(device)
    write(folder, name, content)
    before = tree(folder)
    assert provision(device) == 2
    assert expected in report(device)
    assert "REFUSED" in report(device)
    # nothing applied: the only file written is the outcome, for the router's status
    assert set(tree(device["etc"])) == {"provisioning.json"} and tree(device["data"]) == {}
    after = tree(folder)
    assert after.pop("report.txt") and after == before


def test_garbage_files_are_reported_and_do_not_block_the_rest(device):
    folder = complete_folder(device)
    write(folder, "notes.docx", b"PK\x03\x04 garbage")
    write(folder, "cairn.toml.txt", "[router]\n")
    write(folder, "sensors/readme.md", "hello")
    write(folder, "._cairn.toml", b"\0\5\x16\7 AppleDouble")
    write(folder, ".DS_Store", b"\0\0\0\1Bud1")
    write(folder, "System Volume Information/IndexerVolumeGuid", "{guid}")
    assert provision(device) == 0
    text = report(device)
    assert "notes.docx" in text and "sensors/readme.md" in text
    assert "cairn.toml.txt (did the editor add .txt?" in text
    assert "._cairn.toml" not in text and "DS_Store" not in text and "Volume" not in text
    assert (folder / "notes.docx").exists() and (folder / "sensors/readme.md").exists()


def test_names_match_whatever_their_case_as_on_fat(device):
    folder = device["folder"]
    write(folder, "Hostname", "Greenhouse-7\n")
    write(folder, "Network/WiFi.TOML", WIFI)
    assert provision(device) == 0
    assert (device["data"] / "etc/hostname").read_text() == "greenhouse-7\n"
    assert (device["data"] / NM / "cairn-wifi.nmconnection").is_file()


def test_reserved_files_are_left_as_they_were(device):
    folder = complete_folder(device)
    write(folder, "README.txt", "the example's readme\n")
    reserved = {name: (folder / name).read_bytes()
                for name in ("boot.env", "bootargs.env", "README.txt")}
    provision(device)
    assert {name: (folder / name).read_bytes() for name in reserved} == reserved
    assert "boot.env" not in report(device)


def test_a_second_run_with_nothing_new_does_nothing(device):
    complete_folder(device)
    assert provision(device) == 0
    settings = tree(device["etc"]), tree(device["data"])
    first_report = (device["folder"] / "report.txt").read_bytes()
    (device["etc"] / "cairn.toml").write_text("# changed on the device since\n")
    assert provision(device) == 0
    assert (device["folder"] / "report.txt").read_bytes() == first_report
    assert (device["etc"] / "cairn.toml").read_text() == "# changed on the device since\n"
    assert tree(device["data"]) == settings[1]


def test_files_it_does_not_understand_alone_get_one_report(device):
    write(device["folder"], "cairn.toml.txt", "[router]\n")
    assert provision(device) == 0
    assert "NOTHING APPLIED" in report(device) and "cairn.toml.txt" in report(device)
    assert tree(device["etc"]) == {} and tree(device["data"]) == {}


def test_a_run_that_fails_midway_puts_back_what_it_replaced(device):
    folder = complete_folder(device)
    etc, data = device["etc"], device["data"]
    (etc / "cairn.toml").write_text("# the device's config\n")
    write(data, "etc/ssh/authorized_keys", "ssh-ed25519 AAAA the old key\n")
    write(data, "etc/NetworkManager", "a file where the profiles' folder must go")
    before_settings = tree(etc), tree(data)
    before_folder = tree(folder)
    assert provision(device) == 1
    history = {k: v for k, v in tree(etc).items() if k.startswith("config-history/")}
    settings = {k: v for k, v in tree(etc).items()
                if k not in history and k != "provisioning.json"}
    assert (settings, tree(data)) == before_settings
    assert json.loads(history_outcome(etc))["outcome"] == "failed"
    assert b'"state": "rolled_back"' in history["config-history/0001.json"], history
    after = tree(folder)
    assert after.pop("report.txt") and after == before_folder
    assert "FAILED" in report(device)


def test_a_private_key_in_authorized_keys_is_refused_without_showing_it(device):
    private = device["key"].read_text()
    write(device["folder"], "authorized_keys", private)
    assert provision(device) == 2
    text = report(device)
    assert "authorized_keys: -: holds a private key" in text
    assert private.splitlines()[1] not in text


def test_an_authorized_keys_without_keys_is_refused(device):
    write(device["folder"], "authorized_keys", "# nobody yet\n\n")
    assert provision(device) == 2
    assert "authorized_keys: -: holds no key" in report(device)


def junk_keys(lines: int) -> str:
    """What a broken card or a hostile one may hold: lines like keys that are none."""
    return "".join(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:032d} junk{i}\n"
                   for i in range(lines))


@pytest.fixture
def keygen_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A log with a line for each ssh-keygen run (a stand-in first on PATH runs the real one)."""
    log, shim = tmp_path / "ssh-keygen.runs", tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("ssh-keygen")
    (shim / "ssh-keygen").write_text(f'#!/bin/sh\necho run >> {log}\nexec {real} "$@"\n')
    (shim / "ssh-keygen").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    log.touch()
    return log


def runs(log: Path) -> int:
    return len(log.read_text().splitlines())


def test_keys_are_checked_in_one_ssh_keygen_run(device, tmp_path, keygen_runs):
    other = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    before = runs(keygen_runs)
    keys = Path(f"{device['key']}.pub").read_text() + Path(f"{other}.pub").read_text()
    write(device["folder"], "authorized_keys", keys * 20)
    assert provision(device) == 0
    assert runs(keygen_runs) - before == 1
    assert "40 key(s): SHA256:" in report(device)


def test_more_key_lines_than_a_device_takes_are_refused_unchecked(device, keygen_runs):
    write(device["folder"], "authorized_keys", junk_keys(2000))
    assert provision(device) == 2
    assert runs(keygen_runs) == 0
    assert "authorized_keys: -: 2000 lines of keys, more than the 100 a device takes" in \
        report(device)


def test_a_junk_file_costs_two_ssh_keygen_runs_and_names_its_first_bad_line(device,
                                                                            keygen_runs):
    write(device["folder"], "authorized_keys", junk_keys(100))
    assert provision(device) == 2
    assert runs(keygen_runs) == 2
    text = report(device)
    assert "authorized_keys: line 1: not an SSH public key" in text
    assert "the lines after it were not checked" in text and "line 2:" not in text


def test_the_first_bad_line_after_good_keys_is_the_one_named(device):
    good = Path(f"{device['key']}.pub").read_text()
    write(device["folder"], "authorized_keys", good * 3 + junk_keys(2) + good)
    assert provision(device) == 2
    assert "authorized_keys: line 4: not an SSH public key" in report(device)


def test_key_options_are_named_in_the_report(device):
    key = Path(f"{device['key']}.pub").read_text()
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", f"{device['key']}.pub"],
                                 capture_output=True, text=True, check=True).stdout.split()[1]
    write(device["folder"], "authorized_keys",
          key + 'command="/usr/bin/backup --to x, y",from="10.0.0.0/8",environment="TZ=UTC",'
                f"no-pty {key}")
    assert provision(device) == 0
    text = report(device)
    assert f"line 2 ({fingerprint}): command, from, environment, no-pty" in text
    assert "line 1 (" not in text and "/usr/bin/backup" not in text


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def test_an_update_keyring_of_ca_certificates_is_installed(device, tmp_path):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", tmp_path / "ca.key", "-out", tmp_path / "ca.pem",
            "-days", "30", "-subj", "/CN=Cairn test update CA")
    shutil.copy(tmp_path / "ca.pem", device["folder"] / "update-keyring.pem")
    assert provision(device) == 0
    assert (device["etc"] / "update/keyring.pem").read_bytes() == \
        (tmp_path / "ca.pem").read_bytes()


@pytest.mark.parametrize("content, problem", [
    ("-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n", "holds a private key"),
    ("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
     "not a certificate that can be loaded"),
    ("just text\n", "no PEM certificate"),
], ids=["private_key", "broken_certificate", "text"])
def test_an_update_keyring_that_is_not_a_ca_certificate_is_refused(device, content, problem):
    write(device["folder"], "update-keyring.pem", content)
    assert provision(device) == 2
    assert f"update-keyring.pem: -: {problem}" in report(device)


def test_two_wifi_profiles_in_different_countries_are_refused(device):
    write(device["folder"], "network/a.toml", WIFI)
    write(device["folder"], "network/b.toml", WIFI.replace('"de"', '"fr"'))
    assert provision(device) == 2
    assert "network: country: the profiles name different countries" in report(device)


def test_a_remove_file_removes_its_profile_and_says_so(device):
    write(device["folder"], "network/wifi.toml", WIFI)
    write(device["folder"], "network/lte.toml", CELLULAR)
    assert provision(device) == 0
    write(device["folder"], "network/wifi.toml", "remove = true\n")
    assert provision(device) == 0, report(device)
    assert {p.name for p in (device["data"] / NM).iterdir()} == {"cairn-lte.nmconnection"}
    assert "network/wifi.toml: removed network profile cairn-wifi (" in report(device)
    assert not (device["folder"] / "network").exists()  # consumed, as any applied input


def test_removing_a_profile_the_device_does_not_have_is_reported_not_refused(device):
    write(device["folder"], "network/old-wifi.toml", "remove = true\n")
    write(device["folder"], "hostname", "greenhouse-7\n")
    assert provision(device) == 0, report(device)
    assert (device["data"] / "etc/hostname").read_text() == "greenhouse-7\n"
    assert "network/old-wifi.toml: no network profile cairn-old-wifi on this device: " \
           "nothing to remove" in report(device)
    assert not (device["folder"] / "network/old-wifi.toml").exists()


def test_a_dry_run_writes_nothing(device, capsys):
    folder = complete_folder(device)
    before = tree(folder)
    assert provision(device, "--dry-run") == 0
    assert tree(folder) == before
    assert tree(device["etc"]) == {} and tree(device["data"]) == {}
    assert "CHECKED" in capsys.readouterr().err


# -- NetworkManager keyfiles -----------------------------------------------------------------

def render(tmp_path: Path, name: str, text: str, capsys: pytest.CaptureFixture[str]
           ) -> configparser.ConfigParser:
    path = write(tmp_path, f"{name}.toml", text)
    assert cli.main(["provision", "--render-network", str(path)]) == 0
    keyfile = configparser.ConfigParser(interpolation=None)
    keyfile.read_string(capsys.readouterr().out)
    return keyfile


def test_a_wifi_profile_renders_ssid_psk_and_an_unmetered_link(tmp_path, capsys):
    keyfile = render(tmp_path, "wifi", WIFI + "hidden = true\npriority = 5\n", capsys)
    assert dict(keyfile["connection"]) == {
        "id": "cairn-wifi", "uuid": profile_uuid("cairn-wifi"), "type": "wifi",
        "autoconnect-priority": "5", "metered": "2"}
    assert dict(keyfile["wifi"]) == {"mode": "infrastructure", "ssid": "Greenhouse",
                                     "hidden": "true"}
    assert dict(keyfile["wifi-security"]) == {"key-mgmt": "wpa-psk",
                                              "psk": "correct horse battery"}


def test_a_cellular_profile_renders_a_metered_gsm_link(tmp_path, capsys):
    keyfile = render(tmp_path, "lte", CELLULAR, capsys)
    assert keyfile["connection"]["type"] == "gsm"
    assert keyfile["connection"]["metered"] == "1"
    assert dict(keyfile["gsm"]) == {"apn": "internet", "pin": "1234"}


def test_an_ethernet_profile_renders_a_static_address(tmp_path, capsys):
    keyfile = render(tmp_path, "lan", ETHERNET, capsys)
    assert keyfile["connection"]["type"] == "ethernet"
    assert dict(keyfile["ipv4"]) == {"method": "manual",
                                     "address1": "192.168.7.20/24,192.168.7.1",
                                     "dns": "192.168.7.1;"}


def test_an_ethernet_profile_defaults_to_dhcp(tmp_path, capsys):
    keyfile = render(tmp_path, "lan", 'type = "ethernet"\nmetered = true\n', capsys)
    assert keyfile["ipv4"]["method"] == "auto"
    assert keyfile["connection"]["metered"] == "1"


def test_a_profile_keeps_its_uuid_when_provisioned_again(tmp_path, capsys):
    first = render(tmp_path, "wifi", WIFI, capsys)
    second = render(tmp_path, "wifi", WIFI.replace("Greenhouse", "Barn"), capsys)
    assert first["connection"]["uuid"] == second["connection"]["uuid"]


def test_an_ssid_with_odd_characters_is_written_as_its_bytes(tmp_path, capsys):
    keyfile = render(tmp_path, "wifi", 'type = "wifi"\nssid = "Café;1"\n', capsys)
    ssid = bytes(int(b) for b in keyfile["wifi"]["ssid"].rstrip(";").split(";"))
    assert ssid.decode() == "Café;1"
    assert "wifi-security" not in keyfile  # no passphrase: an open network


@pytest.mark.parametrize("text, key", [
    ('type = "wifi"\nssid = "x"\npassphrase = "short"\n', "passphrase"),
    ('type = "cellular"\napn = "internet"\npin = 1234\n', "pin"),
    ('type = "cellular"\n', "apn"),
    ('type = "ethernet"\ndhcp = false\naddress = "10.0.0.5"\n', "address"),
    ('type = "wifi"\nssid = "x"\ncountry = "Germany"\n', "country"),
    ('ssid = "x"\n', "type"),
], ids=["short_passphrase", "pin_as_number", "no_apn", "no_prefix", "country_name", "no_type"])
def test_a_bad_network_file_names_its_key(tmp_path, capsys, text, key):
    path = write(tmp_path, "net.toml", text)
    assert cli.main(["provision", "--render-network", str(path)]) == 2
    assert f"net.toml: {key}: " in capsys.readouterr().err


def nmcli_offline() -> bool:
    if shutil.which("nmcli") is None:
        return False
    probe = subprocess.run(["nmcli", "--offline", "connection", "add", "type", "ethernet",
                            "con-name", "probe"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not nmcli_offline(), reason="needs nmcli --offline (NetworkManager 1.40+)")
@pytest.mark.parametrize("name, text", [("wifi", WIFI), ("lte", CELLULAR), ("lan", ETHERNET)],
                         ids=["wifi", "cellular", "ethernet"])
def test_networkmanager_reads_the_rendered_keyfile(tmp_path, capsys, name, text):
    """nmcli --offline connection modify parses a keyfile from stdin and verifies the
    connection before it writes it back (the daemon's own keyfile reader); it writes back
    every value that is not NetworkManager's default, so ours must all be there."""
    keyfile = render(tmp_path, name, text, capsys)
    rendered = tmp_path / "rendered"
    with rendered.open("w") as f:
        keyfile.write(f, space_around_delimiters=False)
    with rendered.open() as stdin:
        result = subprocess.run(["nmcli", "--offline", "connection", "modify", "connection.id",
                                 f"cairn-{name}"], stdin=stdin, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    read_back = configparser.ConfigParser(interpolation=None)
    read_back.read_string(result.stdout)
    for section in keyfile.sections():
        assert dict(read_back[section]).items() >= dict(keyfile[section]).items()


# -- the example folder the image ships ------------------------------------------------------

EXAMPLE = ROOT / "images/provision"


def test_the_shipped_examples_are_accepted_once_renamed(device):
    folder = device["folder"]
    for sample in EXAMPLE.rglob("*.sample"):
        name = sample.relative_to(EXAMPLE).as_posix().removesuffix(".sample")
        write(folder, name, sample.read_text())
    write(folder, "secrets/README.txt", (EXAMPLE / "secrets/README.txt").read_text())
    with (folder / "authorized_keys").open("a") as f:
        f.write(Path(f"{device['key']}.pub").read_text())
    write(folder, "secrets/sync-token", "a-sync-token-of-some-length\n")
    assert provision(device) == 0, report(device)
    assert {p.name for p in (device["data"] / NM).iterdir()} == {
        "cairn-wifi.nmconnection", "cairn-cellular.nmconnection", "cairn-ethernet.nmconnection"}
    assert not (device["etc"] / "secrets/README.txt").exists()


def test_the_example_folder_copied_as_it_is_applies_nothing(device):
    shutil.rmtree(device["folder"])
    shutil.copytree(EXAMPLE, device["folder"])
    assert provision(device) == 0
    assert tree(device["etc"]) == {} and tree(device["data"]) == {}
    assert "hostname.sample (an example: remove .sample" in report(device)


def test_a_provisioned_config_is_recorded_and_the_image_config_kept_as_the_last_good(device):
    """The config a first boot replaces (the image's own) becomes the last good one, so a
    provisioned config the router cannot start on has something to fall back to."""
    shipped = (SHIPPED / "cairn.toml").read_text()
    (device["etc"] / "cairn.toml").write_text(shipped)
    complete_folder(device)
    assert provision(device) == 0
    history = History(device["etc"] / "cairn.toml")
    (change,) = history.changes()
    assert (change.by, change.state, change.action) == (
        "cairn provision from the boot partition", "pending", "restart")
    assert history.text(change.id) == cairn_toml(device)
    assert history.last_good_text() == shipped


def test_a_later_provisioned_config_leaves_the_last_good_one_alone(device):
    history = History(device["etc"] / "cairn.toml")
    (device["etc"] / "cairn.toml").write_text((SHIPPED / "cairn.toml").read_text())
    history.mark_good("# the one the router last ran on\n")
    complete_folder(device)
    assert provision(device) == 0
    assert history.last_good_text() == "# the one the router last ran on\n"


def test_each_run_records_its_outcome_for_the_router_without_secrets(device):
    """The router's status (and the dashboard's banner) shows the last refusal."""
    complete_folder(device)
    write(device["folder"], "hostname", "two words\n")
    assert provision(device) == 2
    outcome = json.loads(history_outcome(device["etc"]))
    assert outcome["outcome"] == "refused"
    assert any("hostname" in p for p in outcome["problems"]), outcome
    assert "a-sync-token" not in history_outcome(device["etc"])
    write(device["folder"], "hostname", "one-word\n")
    assert provision(device) == 0
    assert json.loads(history_outcome(device["etc"]))["outcome"] == "applied"


def test_a_refused_folder_taken_away_clears_the_refusal(device):
    write(device["folder"], "hostname", "two words\n")
    assert provision(device) == 2
    (device["folder"] / "hostname").unlink()
    assert provision(device) == 0
    assert json.loads(history_outcome(device["etc"]))["outcome"] == "cleared"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a file system needs root")
def test_a_read_only_boot_partition_is_writable_only_while_provisioning_writes_it(device):
    """The device mounts its FAT read-only (nothing writes it on a normal boot): provisioning
    makes it writable to take the files off and write the report, then read-only again.
    (An ext4 stands in for the FAT: this kernel may have no vfat, and the remount is the
    same.)"""
    image, mount = device["boot"].with_name("boot.img"), device["boot"]
    subprocess.run(["mkfs.ext4", "-q", str(image), "8M"], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        write(device["folder"], "hostname", "greenhouse-2\n")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        assert provision(device) == 0
        assert not (device["folder"] / "hostname").exists()
        assert "APPLIED" in report(device)
        assert os.statvfs(mount).f_flag & os.ST_RDONLY
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# -- a folder that is not FAT (--from): links and special files are never followed ------------


def test_a_secret_that_is_a_symlink_is_refused_and_its_target_neither_copied_nor_scrubbed(
        device, tmp_path):
    folder = complete_folder(device)
    target = tmp_path / "host-key"
    target.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (folder / "secrets/sync-token").unlink()
    (folder / "secrets/sync-token").symlink_to(target)
    assert provision(device) == 2
    assert target.read_text() == "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    assert not (device["etc"] / "secrets/sync-token").exists()
    assert "secrets/sync-token: -: a symbolic link" in report(device)


def test_a_group_folder_that_is_a_symlink_is_refused_and_not_read(device, tmp_path):
    folder = device["folder"]
    outside = tmp_path / "elsewhere"
    write(outside, "token", "the target's own secret\n")
    (folder / "secrets").symlink_to(outside)
    assert provision(device) == 2
    assert (outside / "token").read_text() == "the target's own secret\n"
    assert not (device["etc"] / "secrets").exists()
    assert "secrets: -: a symbolic link" in report(device)


def test_a_fifo_in_the_folder_is_refused_without_waiting_for_a_writer(device):
    os.mkfifo(device["folder"] / "cairn.toml")
    assert provision(device) == 2
    assert "cairn.toml: -: not a regular file (a FIFO)" in report(device)
