#!/bin/bash
# The base root file system of the Cairn image: Debian trixie (13) arm64 from Debian's
# archive, the packages of ./packages, the kernel and its initramfs. Nothing of Cairn is in
# it. The slow layer (~10-20 min under qemu-user), so it is cached as a tarball in CACHE_DIR
# under a key made of this file, ./packages and ./initramfs-modules: the code that fills the
# cache is part of its own key, so a change to it is run on an empty cache by the next build
# (the cold path cannot rot unseen behind a warm cache). Prints the tarball's path.
#
#   images/debian/base.sh CACHE_DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=$1
SUITE=trixie
MIRROR=${CAIRN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${CAIRN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
COMPONENTS="main non-free-firmware"   # raspi-firmware is in non-free-firmware

say() { echo "base.sh: $*" >&2; }

key=$(cat "$HERE/packages" "$HERE/initramfs-modules" "$HERE/base.sh" | sha256sum | cut -c1-16)
BASE=$CACHE/debian-$SUITE-base-arm64-$key.tar
if [ -f "$BASE" ]; then
    say "from the cache: $BASE"
    echo "$BASE"
    exit 0
fi
say "building (cache miss, ~10-20 min): $BASE"
mkdir -p "$CACHE"
packages=$(grep -v '^#' "$HERE/packages" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')

# --format=tar: mmdebstrap picks its format from the output's name otherwise, and BASE.tmp
# (no .tar at the end) would be a directory. The initramfs settings go in before the kernel
# is installed, so that its one update-initramfs run uses them. Neither file is a dpkg
# conffile. u-boot-qemu's package (the same U-Boot release as u-boot-rpi's, for QEMU's virt
# machine) is only fetched into /var/cache/cairn-host: build-image.sh takes the test's
# firmware (-bios) out of it and leaves it out of the image. FSTYPE=ext4: in a chroot the fsck hook cannot probe the root's type and would
# leave fsck out of the initramfs ("fsck not present, so skipping root file system" at boot).
rm -rf "$BASE.tmp"
mmdebstrap --arch=arm64 --variant=apt --format=tar --components="$COMPONENTS" \
    --include="$packages" \
    --aptopt='Acquire::Retries "3"' \
    --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d"' \
    --setup-hook="printf '%s\n' MODULES=list COMPRESS=gzip FSTYPE=ext4 > \"\$1/etc/initramfs-tools/conf.d/cairn\"" \
    --setup-hook="grep -v '^#' '$HERE/initramfs-modules' > \"\$1/usr/share/initramfs-tools/modules.d/cairn\"" \
    --customize-hook='mkdir -p "$1/var/cache/cairn-host"' \
    --customize-hook='chroot "$1" sh -c "cd /var/cache/cairn-host && apt-get download u-boot-qemu"' \
    --customize-hook='chroot "$1" apt-get clean' \
    "$SUITE" "$BASE.tmp" \
    "deb $MIRROR $SUITE $COMPONENTS" \
    "deb $MIRROR $SUITE-updates $COMPONENTS" \
    "deb $SECURITY $SUITE-security $COMPONENTS" >&2
# a cache entry is a whole tarball or nothing: anything else would be taken for the base by
# every later build
tar -tf "$BASE.tmp" > /dev/null 2>&1 ||
    { say "mmdebstrap made no tarball at $BASE.tmp"; rm -rf "$BASE.tmp"; exit 1; }
mv "$BASE.tmp" "$BASE"
echo "$BASE"
