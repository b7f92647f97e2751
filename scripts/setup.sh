#!/usr/bin/env bash
# Set up Cairn in ./.venv on a Debian machine with Python 3.11, installing what is missing.
#   scripts/setup.sh            the router and drivers
#   scripts/setup.sh test       plus the test tools (and the system packages tests use)
#   scripts/setup.sh docs       plus MkDocs, which builds the documentation site (make docs)
#   scripts/setup.sh image      only the system packages that build the device image and
#                               boot it in QEMU (make image, make appliance-test)
set -euo pipefail
# one set-up at a time: .ci/run starts the image build and `make test` together, and two
# pip runs in one virtualenv (or two apt-gets) would trip over each other
exec 9<"$0"
flock 9
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PROFILE=${1:-run}

apt_updated=""
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        echo "setup: please install: ${missing[*]} (needs root and apt-get)" >&2
        return 1
    fi
    echo "setup: installing ${missing[*]}" >&2
    [ -n "$apt_updated" ] || { DEBIAN_FRONTEND=noninteractive apt-get update -qq; apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# QEMU >= 9 (its Raspberry Pi machines raspi3b and raspi4b, for the Pi's own boot path and
# I2C chips): Debian 13 has it; on Debian 12 it comes from bookworm-backports (10.0), since
# bookworm's own is 7.2. Installed, not unpacked: a 10.x beside 7.2's modules aborts.
qemu_major() {
    command -v qemu-system-aarch64 >/dev/null || { echo 0; return; }
    qemu-system-aarch64 --version | sed -n 's/^QEMU emulator version \([0-9]*\).*/\1/p'
}
install_qemu() {
    [ "$(qemu_major)" -ge 9 ] && return 0
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" = bookworm ] && [ "$(id -u)" -eq 0 ]; then
        local list=/etc/apt/sources.list.d/cairn-bookworm-backports.list
        [ -f "$list" ] || echo "deb http://deb.debian.org/debian bookworm-backports main" > "$list"
        echo "setup: installing qemu-system-arm from bookworm-backports" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
            qemu-system-arm >/dev/null
    else
        apt_install qemu-system-arm
    fi
    [ "$(qemu_major)" -ge 9 ] || {
        echo "setup: QEMU $(qemu_major) is too old: Cairn's tests need qemu-system-arm 9 or newer" >&2
        return 1
    }
}

if [ "$PROFILE" = image ]; then
    # mmdebstrap runs arm64 packages' scripts through qemu-user (binfmt_misc); the image is
    # assembled from files (mtools, mkfs.ext4 -d, sfdisk); the appliance test boots it in
    # qemu-system-aarch64 and talks to it over ssh; socat carries each of the guest's
    # connections to a host service (QEMU guestfwd); U-Boot's boot script and state file are
    # made with mkimage and mkenvimage (u-boot-tools), update bundles with rauc (squashfs)
    apt_install mmdebstrap qemu-user-static binfmt-support arch-test dosfstools mtools \
        e2fsprogs fdisk xz-utils openssh-client socat u-boot-tools rauc squashfs-tools openssl
    install_qemu
    exit 0
fi

pip_install() {  # quiet on success, the whole log on failure
    local log
    log=$(mktemp)
    if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
        cat "$log" >&2; rm -f "$log"; return 1
    fi
    rm -f "$log"
}

if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    apt_install python3-venv
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Installing builds the dashboard's WAMP client (setup.py: npm ci of the pinned autobahn-js)
# unless it is there already
if [ ! -s gateway/dashboard/autobahn.min.js ] && ! command -v npm >/dev/null; then
    apt_install nodejs npm
fi
# pip runs again only when what it installs from changed: the install is editable, so a
# change to the sources needs none, and a run beside tests must not reinstall under them
stamp=.venv/.cairn-setup-$PROFILE
wanted=$(cat pyproject.toml setup.py gateway/dashboard/package-lock.json | sha256sum)
installed() { [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] && [ -s gateway/dashboard/autobahn.min.js ]; }
installed || pip_install --upgrade pip
if [ "$PROFILE" = test ]; then
    # the Spark tests (tests/test_spark.py) need PySpark and a Java runtime (17 works)
    command -v java >/dev/null || apt_install default-jre-headless
    # docs: tests/system/test_docs.py builds the documentation site (mkdocs build --strict)
    installed || pip_install -e ".[test,spark,docs]"
    # the MQTT bridge tests run a real broker; the image tests partition and format card
    # images (sfdisk, mkfs.ext4); the A/B boot chooser runs in U-Boot under QEMU (u-boot-qemu
    # as the firmware, mkimage and mkenvimage from u-boot-tools, a FAT made with mtools)
    apt_install mosquitto fdisk e2fsprogs u-boot-qemu u-boot-tools mtools dosfstools \
        libubootenv-tool
    install_qemu
elif [ "$PROFILE" = docs ]; then
    installed || pip_install -e ".[docs]"
else
    installed || pip_install -e .
fi
echo "$wanted" > "$stamp"

if [ "$PROFILE" = test ]; then
    # the dashboard tests drive Debian's chromium through Playwright (they skip without it)
    apt_install chromium || echo "setup: without chromium the dashboard tests are skipped" >&2
fi
.venv/bin/python -c "import cairn.gateway.shell.server" # fails loudly if the install did not work
