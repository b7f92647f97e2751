"""Who wrote a batch: the gateway's Ed25519 signature over its manifest, and the fleet's list
of gateway keys the central job checks it against.

The landing folder a batch arrives in proves nothing: anyone holding the sink's credential,
or a store copied off another gateway, can land a batch under any gateway's name. The
signature does. Each gateway makes its own key once (:func:`gateway_key`: ``signing.key``
in its data directory, mode 0600, PKCS#8 PEM, which ``openssl pkey`` reads), signs every
manifest it ships (:func:`sign`), and ``cairn sync --show-key`` prints its line for the
fleet's keys file (:class:`GatewayKeys`), which ``cairn spark ingest --gateway-keys FILE``
reads::

    # gateway id   its public key                                  (anything after: a comment)
    greenhouse-7   ed25519:4rJ3C2...base64 of the 32-byte key...=  replaced card, 2026-11

A gateway may have several lines (a new key before the old one's batches are all in). The
signature covers the manifest as its reader sees it: the JSON object without ``signature``,
keys sorted, no spaces, UTF-8, after a label naming what it is (:func:`signed_bytes`); and,
through the manifest's ``bytes`` and ``sha256``, the data file. In the manifest it is
``"signature": {"key": "ed25519:...", "value": base64 of the 64 bytes}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cairn.base.files import write_atomically

FIELD = "signature"
KEY_PREFIX = "ed25519:"
LABEL = b"cairn batch manifest v1\n"  # a signature over a manifest is never one over anything else
MAX_KEYS_FILE_BYTES = 16 * 1024 * 1024


def signed_bytes(manifest: dict[str, Any]) -> bytes:
    """What the signature is over: ``manifest`` without its signature, canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != FIELD}
    return LABEL + json.dumps(body, sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False).encode()


def sign(manifest: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """``manifest`` with its signature by ``key``."""
    value = key.sign(signed_bytes(manifest))
    return {**manifest, FIELD: {"key": public_text(key.public_key()),
                                "value": base64.b64encode(value).decode()}}


def public_text(key: Ed25519PublicKey) -> str:
    """``ed25519:`` and the base64 of the raw 32 bytes: how keys are written everywhere here."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode()


def public_key_of(text: str) -> Ed25519PublicKey:
    """The key :func:`public_text` wrote; ValueError for anything else."""
    if not text.startswith(KEY_PREFIX):
        raise ValueError(f"{text[:60]!r} is not an {KEY_PREFIX}BASE64 key")
    try:
        raw = base64.b64decode(text.removeprefix(KEY_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError(f"{text[:60]!r}: the key is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"{text[:60]!r}: an Ed25519 key is 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


# -- the gateway's side ------------------------------------------------------------------------

def gateway_key(path: Path, owner_like: Path | None = None) -> Ed25519PrivateKey:
    """The gateway's signing key in ``path``, made on first use. ``owner_like``: a new key is
    given that directory's owner (root making it for the ``cairn`` user, which signs).
    OSError when it cannot be read or made, ValueError when the file holds no Ed25519 key:
    a gateway never goes on with a key that is not the one the fleet lists."""
    try:
        pem = path.read_bytes()
    except FileNotFoundError:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        uid, gid = _owner_to_give(owner_like)
        write_atomically(path, pem, mode=0o600, uid=uid, gid=gid)
        return key
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def _owner_to_give(like: Path | None) -> tuple[int, int]:
    """The owner and group of ``like`` where they are not this process's (-1 where they
    are): cairn-sync's seccomp filter refuses every chown, even to its own user."""
    if like is None:
        return -1, -1
    st = like.stat()
    return (st.st_uid if st.st_uid != os.geteuid() else -1,
            st.st_gid if st.st_gid != os.getegid() else -1)


# -- the central side --------------------------------------------------------------------------

class GatewayKeys:
    """The fleet's keys file: for each gateway id, the public keys its batches may be signed
    with. :meth:`problem` says why a manifest may not be ingested, or None."""

    def __init__(self, keys: dict[str, set[str]], source: str) -> None:
        self.keys, self.source = keys, source

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> GatewayKeys:
        """The keys file at ``path``; ValueError naming the file and line of a bad one."""
        with open(path, "rb") as f:
            data = f.read(MAX_KEYS_FILE_BYTES + 1)
        if len(data) > MAX_KEYS_FILE_BYTES:
            raise ValueError(f"{path}: over {MAX_KEYS_FILE_BYTES} bytes: not a keys file")
        return cls.parse(data.decode("utf-8", errors="replace"), str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> GatewayKeys:
        keys: dict[str, set[str]] = {}
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()  # neither ids nor base64 hold a "#"
            if not words:
                continue
            if len(words) < 2:
                raise ValueError(f"{source} line {number}: want a gateway id and its key")
            try:
                public_key_of(words[1])
            except ValueError as e:
                raise ValueError(f"{source} line {number}: {e}") from None
            keys.setdefault(words[0], set()).add(words[1])
        return cls(keys, source)

    def problem(self, manifest: dict[str, Any]) -> str | None:
        """Why ``manifest`` (parsed) is not vouched for by its gateway's key, or None."""
        gateway, signature = manifest["gateway_id"], manifest.get(FIELD)
        listed = self.keys.get(gateway)
        if not listed:
            return f"gateway {gateway!r} has no key in {self.source}"
        if signature is None:
            return f"the manifest is not signed, and {self.source} lists gateway {gateway!r}"
        if not (isinstance(signature, dict) and isinstance(signature.get("key"), str)
                and isinstance(signature.get("value"), str)):
            return "manifest field 'signature' is not an object of a key and a value"
        if signature["key"] not in listed:
            return (f"signed by {signature['key'][:60]}, which {self.source} does not list "
                    f"for gateway {gateway!r}")
        try:
            value = base64.b64decode(signature["value"], validate=True)
            public_key_of(signature["key"]).verify(value, signed_bytes(manifest))
        except (ValueError, InvalidSignature):  # binascii.Error is a ValueError
            return (f"the signature of gateway {gateway!r} does not match its manifest "
                    "(changed after it was signed)")
        return None
