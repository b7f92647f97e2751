#!/bin/bash
# The base root file system of the Cairn image: Debian trixie (13) arm64 from Debian's
# archive, the packages of ./packages, the kernel and its initramfs. The slow layer (~10 min
# under qemu-user), so build-image.sh caches its tarball under a key made of this file,
# ./packages and ./initramfs-modules. Nothing of Cairn is in it.
#
#   images/debian/base.sh OUT       a tarball, whatever OUT's name (--format=tar: mmdebstrap
#                                   would otherwise pick a directory for a name without .tar)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1
SUITE=trixie
MIRROR=${CAIRN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${CAIRN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
COMPONENTS="main non-free-firmware"   # raspi-firmware is in non-free-firmware

packages=$(grep -v '^#' "$HERE/packages" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')

# The initramfs settings go in before the kernel is installed, so that its one
# update-initramfs run uses them. Neither file is a dpkg conffile. FSTYPE=ext4: in a chroot
# the fsck hook cannot probe the root's type and would leave fsck out of the initramfs
# ("fsck not present, so skipping root file system" at boot).
mmdebstrap --arch=arm64 --variant=apt --format=tar --components="$COMPONENTS" --include="$packages" \
    --aptopt='Acquire::Retries "3"' \
    --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d"' \
    --setup-hook="printf '%s\n' MODULES=list COMPRESS=gzip FSTYPE=ext4 > \"\$1/etc/initramfs-tools/conf.d/cairn\"" \
    --setup-hook="grep -v '^#' '$HERE/initramfs-modules' > \"\$1/usr/share/initramfs-tools/modules.d/cairn\"" \
    --customize-hook='chroot "$1" apt-get clean' \
    "$SUITE" "$OUT" \
    "deb $MIRROR $SUITE $COMPONENTS" \
    "deb $MIRROR $SUITE-updates $COMPONENTS" \
    "deb $SECURITY $SUITE-security $COMPONENTS"
