#!/bin/sh
# Install (or upgrade) Cairn from this payload, on Raspberry Pi OS or into an image chroot.
#
#   sudo ./install.sh                 install, enable cairn-router, (re)start it if running
#   CAIRN_ENABLE="" ./install.sh      install only
#
# - Checks every file against SHA256SUMS first.
# - Python: a venv per wheel, /opt/cairn-<version>-<hash>, with the wheel and the pinned
#   dependency versions of constraints.txt; /opt/cairn is a symlink switched atomically to
#   the new one once it accepts /etc/cairn/cairn.toml, so the units' /opt/cairn/bin/cairn
#   changes in one step, and the previous venv stays for a rollback (see IMAGE.md).
# - Files under rootfs/ go to /. A file under /etc that was edited since the last install
#   is kept, and the shipped version is put next to it as <name>.dist.
# - The cairn system user (sysusers.d) and /etc/cairn (tmpfiles.d) are created.
set -eu
# The venv is the device's, not the caller's: a PYTHONPATH (or PYTHONHOME) of the shell that
# runs this would leak into its pip and python (seen: the venv's cairn never got made)
unset PYTHONPATH PYTHONHOME

HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
ENABLE=${CAIRN_ENABLE-cairn-router.service}
KEEP_VENVS=${CAIRN_KEEP_VENVS:-2}

say() { echo "install.sh: $*"; }

[ "$(id -u)" -eq 0 ] || { say "run me as root" >&2; exit 1; }
cd "$HERE"
sha256sum --quiet --strict -c SHA256SUMS || { say "payload damaged (SHA256SUMS)" >&2; exit 1; }
VERSION=$(sed -n 's/^ *"version": "\(.*\)",$/\1/p' manifest.json | head -n 1)
WHEEL=$(ls wheels/cairn-*.whl)
# The dependencies come from the payload (wheels/deps, built for linux aarch64) and nowhere
# else: a device off the grid has no package index. Elsewhere (an x86-64 box, a payload
# built with --no-dependencies) pip fetches them from the index.
if [ "$(uname -m)" = aarch64 ] && ls wheels/deps/*.whl > /dev/null 2>&1; then
    SOURCES="--no-index --find-links wheels/deps"
else
    SOURCES=""
    say "no dependency wheels for $(uname -m) in this payload: pip fetches them from the index"
fi

# -- files --------------------------------------------------------------------------------
# what the previous install shipped, to tell an edited config file from an old shipped one
PREVIOUS=/usr/lib/cairn/payload-manifest.json
shipped_before() {
    [ -f "$PREVIOUS" ] || return 0
    "$PYTHON" -c 'import json, sys
files = json.load(open(sys.argv[1]))["files"]
print(next((f["sha256"] for f in files if f["path"] == sys.argv[2]), ""))' "$PREVIOUS" "$1"
}
find rootfs -type f | sort | while read -r source; do
    target="/${source#rootfs/}"
    mode=$(stat -c %a "$source")
    case "$target" in
        /etc/*)
            if [ -e "$target" ] && ! cmp -s "$source" "$target" &&
                    [ "$(sha256sum < "$target" | cut -d' ' -f1)" != "$(shipped_before "$source")" ]
            then
                install -D -m "$mode" "$source" "$target.dist"
                say "kept your $target; the shipped one is $target.dist"
                continue
            fi ;;
    esac
    install -D -m "$mode" "$source" "$target"
done

# -- user and directories -----------------------------------------------------------------
systemd-sysusers /usr/lib/sysusers.d/cairn.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/cairn.conf

# -- Python ---------------------------------------------------------------------------------
# One venv per wheel (version and content): reinstalling the same payload is a no-op, and
# the venv the running router uses is never modified under it.
VENV="/opt/cairn-$VERSION-$(sha256sum "$WHEEL" | cut -c1-8)"
if [ ! -x "$VENV/bin/cairn" ]; then
    rm -rf "$VENV"
    trap 'rm -rf "$VENV"' EXIT
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
        $SOURCES --constraint constraints.txt "$WHEEL"
    trap - EXIT
fi
"$VENV/bin/cairn" --help >/dev/null
# the new version must accept the config in place before it takes over
"$VENV/bin/cairn" check-config /etc/cairn/cairn.toml
ln -sfn "$(basename "$VENV")" /opt/cairn.new
mv -T /opt/cairn.new /opt/cairn
ln -sfn /opt/cairn/bin/cairn /usr/local/bin/cairn  # `cairn doctor` etc. on the PATH
install -D -m 644 manifest.json "$PREVIOUS"
say "Cairn $VERSION in $VENV; /opt/cairn -> $(basename "$VENV")"
# keep the newest $KEEP_VENVS venvs (the one before this one is the rollback)
ls -dt /opt/cairn-*/ 2>/dev/null | tail -n "+$((KEEP_VENVS + 1))" | while read -r old; do
    [ "${old%/}" = "$VENV" ] || rm -rf "${old%/}"
done

# -- systemd and udev -----------------------------------------------------------------------
live=no
if [ -d /run/systemd/system ] && ! systemd-detect-virt --quiet --chroot; then live=yes; fi
if [ "$live" = yes ]; then
    systemctl daemon-reload
    udevadm control --reload 2>/dev/null && udevadm trigger --subsystem-match=tty || true
fi
for unit in $ENABLE; do systemctl enable "$unit"; done
if [ "$live" = yes ]; then
    systemctl try-restart cairn-router.service
    systemctl try-restart 'cairn-sensor@*.service' 'cairn-bridge-mqtt@*.service' \
        cairn-sync.service || true
    [ -z "$ENABLE" ] || systemctl start $ENABLE
fi
say "done"
