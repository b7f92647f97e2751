#!/bin/bash
# Build the Cairn SD-card image: Raspberry Pi OS Lite (arm64) made by pi-gen, the official
# tool that builds Raspberry Pi OS, plus images/pi-gen/stage-cairn. See images/README.md.
#
#   CAIRN_SSH_PUBKEY="$(cat ~/.ssh/id_ed25519.pub)" images/build-image.sh
#   images/build-image.sh --print-config      the pi-gen config it would use
#
# Needs Docker (pi-gen's build-docker.sh; binfmt/qemu-user-static for arm64 on an x86 host),
# or USE_DOCKER=0 on a Debian/Raspberry Pi OS host with pi-gen's dependencies, as root.
# The image lands in build/image/pi-gen/deploy/.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
WORK=${CAIRN_IMAGE_WORK:-$ROOT/build/image}
PI_GEN_REPO=${PI_GEN_REPO:-https://github.com/RPi-Distro/pi-gen.git}
# A release tag of pi-gen's arm64 branch: the recipe of that Raspberry Pi OS release.
PI_GEN_REF=${PI_GEN_REF:-2026-06-18-raspios-trixie-arm64}
USE_DOCKER=${USE_DOCKER:-1}

say() { echo "build-image: $*" >&2; }

# pi-gen's config with every value resolved here: build-docker.sh passes the file, not this
# shell's environment, into its container.
CONFIG_VARS="IMG_NAME RELEASE STAGE_LIST DEPLOY_COMPRESSION COMPRESSION_LEVEL TARGET_HOSTNAME
LOCALE_DEFAULT KEYBOARD_KEYMAP KEYBOARD_LAYOUT TIMEZONE_DEFAULT WPA_COUNTRY FIRST_USER_NAME
FIRST_USER_PASS DISABLE_FIRST_BOOT_USER_RENAME ENABLE_SSH PUBKEY_ONLY_SSH
PUBKEY_SSH_FIRST_USER CAIRN_READONLY_ROOT"
render_config() {
    (
        # shellcheck source=pi-gen/config
        . "$HERE/pi-gen/config"
        echo "# rendered by images/build-image.sh from images/pi-gen/config"
        for name in $CONFIG_VARS; do
            printf '%s=%q\n' "$name" "${!name}"
        done
        echo "export CAIRN_READONLY_ROOT"
    )
}

if [ "${1:-}" = "--print-config" ]; then render_config; exit 0; fi
[ -n "${CAIRN_SSH_PUBKEY:-}" ] ||
    say "warning: CAIRN_SSH_PUBKEY is empty: the image will have no way in over SSH"

# 1. The payload (wheel, units, config, rules), checked and reproducible.
mkdir -p "$WORK"
payload=$("$PYTHON" "$HERE/build_payload.py" --out "$WORK/payload")
tarball="$payload.tar.gz"
say "payload $(basename "$tarball") sha256 $(sha256sum "$tarball" | cut -d' ' -f1)"

# 2. pi-gen at a fixed release.
PI_GEN="$WORK/pi-gen"
if [ ! -d "$PI_GEN/.git" ]; then
    git clone --depth 1 --branch "$PI_GEN_REF" "$PI_GEN_REPO" "$PI_GEN"
elif [ "$(git -C "$PI_GEN" describe --tags --exact-match 2>/dev/null)" != "$PI_GEN_REF" ]; then
    say "$PI_GEN is not at $PI_GEN_REF: remove it to fetch that release"
    exit 1
fi

# 3. Our stage and config inside the pi-gen tree (build-docker.sh copies only that tree).
rm -rf "$PI_GEN/stage-cairn"
cp -aL "$HERE/pi-gen/stage-cairn" "$PI_GEN/stage-cairn"
cp "$tarball" "$PI_GEN/stage-cairn/00-cairn/files/cairn-payload.tar.gz"
render_config > "$PI_GEN/config"
touch "$PI_GEN/stage2/SKIP_IMAGES"  # export only the Cairn image, not plain Lite as well

# 4. Build.
cd "$PI_GEN"
if [ "$USE_DOCKER" = 1 ]; then
    ./build-docker.sh -c config
else
    ./build.sh -c config
fi
say "done:"
ls -l "$PI_GEN"/deploy/*cairn* >&2
