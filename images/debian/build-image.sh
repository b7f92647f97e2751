#!/bin/bash
# Build the Cairn SD-card image for a Raspberry Pi 4/5 from Debian's archive with Debian's
# tools (trixie, arm64): mmdebstrap, qemu-user via binfmt_misc, raspi-firmware,
# linux-image-arm64. See images/README.md.
#
#   CAIRN_SSH_PUBKEY="$(cat ~/.ssh/id_ed25519.pub)" images/debian/build-image.sh
#   images/debian/build-image.sh --no-xz --out DIR     a raw image (what the appliance test boots)
#
# The host tools: `scripts/setup.sh image` (or `make image`, which runs it) installs them.
#
# Steps: 1. the base root file system (packages, kernel, initramfs), cached by ./base.sh under
# $CAIRN_CACHE keyed by ./packages, ./initramfs-modules and ./base.sh itself; 2. Cairn's payload
# installed with its own install.sh in the image's root, as on a device; 3. the appliance
# (images/appliance/appliance.sh: data partition, read-only root, journal in RAM); 4. the
# system: host name, admin user with SSH by key only, network, fstab, the A/B system
# (images/update: RAUC, the device's settings on the data partition, the health gate);
# 5. the partitioned image (FAT boot partition with U-Boot and its boot script, root slots A
# and B; the data partition is made on first boot in the card's free space), the slot's root
# file system, a signed RAUC bundle of it when a key is given, and a manifest of package
# versions and sha256s.
#
# Settings (environment): CAIRN_SSH_PUBKEY (the default admin keys; a card's
# cairn/authorized_keys replaces them), CAIRN_ADMIN_USER (admin), CAIRN_HOSTNAME (cairn),
# CAIRN_CONFIG (a cairn.toml installed as /etc/cairn/cairn.toml instead of the shipped one),
# CAIRN_UPDATE_KEYRING (the CA certificate, PEM, whose bundles the device accepts),
# CAIRN_BUNDLE_CERT and CAIRN_BUNDLE_KEY (sign a bundle of this build: make bundle),
# CAIRN_CACHE (~/.cache/cairn), CAIRN_IMAGE_WORK (build/image/debian).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
IMAGES=$(dirname "$HERE")
ROOT=$(dirname "$IMAGES")
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
WORK=${CAIRN_IMAGE_WORK:-$ROOT/build/image/debian}
CACHE=${CAIRN_CACHE:-$HOME/.cache/cairn}
OUT=$WORK/out
XZ=1
ADMIN=${CAIRN_ADMIN_USER:-admin}
HOSTNAME_=${CAIRN_HOSTNAME:-cairn}
BOOT_MIB=256          # the FAT boot partition (Pi firmware, device trees, U-Boot, boot.scr)
SLOT_MIB=2048         # each root slot: fixed for a device's life, every later bundle must fit
ROOT_SLACK_MIB=64     # free space in a slot's file system (it is mounted read-only)
# One MBR disk identifier for every Cairn image: RAUC's system.conf names the slots by it,
# and a bundle built later must find them on every card (images/update/system.conf).
DISK_ID=ca11ab1e
COMPATIBLE=cairn-debian-arm64

say() { echo "build-image: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --no-xz) XZ=0; shift ;;
        *) say "unknown argument $1"; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { say "run me as root (mmdebstrap, chroot, file ownership)"; exit 1; }
for tool in mmdebstrap mkfs.vfat mcopy mkfs.ext4 sfdisk xz mkimage mkenvimage; do
    command -v "$tool" > /dev/null ||
        { say "$tool is missing: scripts/setup.sh image installs it"; exit 1; }
done
# arm64 programs run on an x86-64 host through qemu-user, registered with binfmt_misc
if [ "$(dpkg --print-architecture)" != arm64 ]; then
    [ -e /proc/sys/fs/binfmt_misc/status ] ||
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
fi
BUNDLE=0
if [ -n "${CAIRN_BUNDLE_KEY:-}${CAIRN_BUNDLE_CERT:-}" ]; then
    [ -f "${CAIRN_BUNDLE_KEY:-}" ] && [ -f "${CAIRN_BUNDLE_CERT:-}" ] ||
        { say "CAIRN_BUNDLE_KEY and CAIRN_BUNDLE_CERT must both name files"; exit 1; }
    command -v rauc > /dev/null || { say "rauc is missing: scripts/setup.sh image installs it"; exit 1; }
    BUNDLE=1
fi
[ -z "${CAIRN_UPDATE_KEYRING:-}" ] || [ -f "$CAIRN_UPDATE_KEYRING" ] ||
    { say "CAIRN_UPDATE_KEYRING=$CAIRN_UPDATE_KEYRING is not a file"; exit 1; }
[ -n "${CAIRN_UPDATE_KEYRING:-}" ] ||
    say "warning: CAIRN_UPDATE_KEYRING is empty: the image will refuse every update bundle"
[ -n "${CAIRN_SSH_PUBKEY:-}" ] ||
    say "note: CAIRN_SSH_PUBKEY is empty: SSH takes only the keys a card is given in its" \
        "boot partition's cairn/authorized_keys (images/README.md, Personalise each card)"
started=$(date +%s)

# -- 1. the base root file system, cached (base.sh fills the cache on a miss) ------------------
BASE=$("$HERE/base.sh" "$CACHE")

R=$WORK/rootfs
rm -rf "$R" && mkdir -p "$R" "$OUT"
# A command in the image's root with /proc and /dev, in a private mount namespace: the
# mounts are gone when it ends, whatever happens.
in_chroot() {
    unshare --mount --propagation private bash -euc 'R=$1; shift
        mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"
        exec chroot "$R" "$@"' sh "$R" "$@"
}
tar -xpf "$BASE" -C "$R" --numeric-owner --xattrs --xattrs-include='*'
SUITE=$(. "$R/etc/os-release" && echo "$VERSION_CODENAME")   # the base's own word
# QEMU's U-Boot (fetched by base.sh, not part of the image): the firmware the tests and
# images/run-qemu.sh boot the image with
rm -rf "$WORK/u-boot-qemu" && dpkg-deb -x "$R"/var/cache/cairn-host/u-boot-qemu_*.deb "$WORK/u-boot-qemu"
rm -rf "$R/var/cache/cairn-host"

# -- 1b. Debian's updates of the day ------------------------------------------------------------
# The base is cached by its package list, not by date: without this, a bundle built a month
# later would ship a month-old OpenSSL. Every build takes what Debian has published since into
# the root, from the base's own sources (trixie, -updates, -security); full-upgrade installs a
# new kernel ABI's package, autoremove purges the one it replaced. What was taken is listed in
# the build manifest ("debian_updates"). CAIRN_DEBIAN_UPDATES=0 builds from the cached base
# as it is (an offline rebuild). ~2 min under qemu-user, most of it apt reading its lists.
chroot "$R" dpkg-query -W -f '${Package}\t${Version}\n' > "$WORK/packages-base.tsv"
if [ "${CAIRN_DEBIAN_UPDATES:-1}" = 1 ]; then
    say "Debian's updates since the base was built"
    cp -L /etc/resolv.conf "$R/etc/resolv.conf.cairn-build"
    mv "$R/etc/resolv.conf" "$R/etc/resolv.conf.image"   # the image's link (step 4 sets it)
    mv "$R/etc/resolv.conf.cairn-build" "$R/etc/resolv.conf"
    apt_get() {
        in_chroot env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Acquire::Languages=none \
            -o Acquire::Retries=3 -o Dpkg::Options::=--force-confold "$@" >&2
    }
    apt_get update
    apt_get full-upgrade
    apt_get autoremove --purge
    apt_get clean
    rm -rf "$R"/var/lib/apt/lists/* "$R/etc/resolv.conf"
    mv "$R/etc/resolv.conf.image" "$R/etc/resolv.conf"
fi
chroot "$R" dpkg-query -W -f '${Package}\t${Version}\n' > "$WORK/packages-updated.tsv"

# -- 2. Cairn, installed by the payload's own install.sh inside the image's root -------------
payload=$("$PYTHON" "$IMAGES/build_payload.py" --out "$WORK/payload")
tarball="$payload.tar.gz"
say "payload $(basename "$tarball") sha256 $(sha256sum "$tarball" | cut -d' ' -f1)"
mkdir -p "$R/tmp/cairn-payload"
tar -xzf "$tarball" -C "$R/tmp/cairn-payload" --strip-components=1 --no-same-owner
# A private mount namespace: /proc and /dev are visible to the chroot only, and gone when it
# ends. Nothing is fetched: the payload carries every dependency as an arm64 wheel
# (wheels/deps), as a device off the grid needs it to.
unshare --mount --propagation private bash -euc '
    R=$1
    mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"; mount -t tmpfs tmpfs "$R/run"
    chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        CAIRN_ENABLE=cairn-router.service /tmp/cairn-payload/install.sh
' sh "$R"
cp "$R/tmp/cairn-payload/manifest.json" "$WORK/payload-manifest.json"
rm -rf "$R/tmp/cairn-payload"
if [ -n "${CAIRN_CONFIG:-}" ]; then
    # A site's own config, as if edited on the device: an upgrade keeps it (install.sh puts
    # the shipped one beside it as .dist). Checked by the installed Cairn.
    install -m 644 "$CAIRN_CONFIG" "$R/etc/cairn/cairn.toml"
    chroot "$R" /opt/cairn/bin/cairn check-config /etc/cairn/cairn.toml
fi

# -- 3. the appliance (the same script as the Raspberry Pi OS image) and the A/B system -----
# The root is the slot U-Boot chose (root=PARTUUID=... from boot.scr), read-only under its
# overlay. /boot/firmware (the Pi firmware, U-Boot, the device trees, boot.scr; the cairn/
# folder provisioning reads) is mounted read-only and never checked at boot: nothing writes
# the FAT on a normal boot (a read-write mount alone writes its boot sector twice, the dirty
# flag set and cleared; a power cut between leaves it set, and fsck -a would then write it),
# so a power cut cannot tear what the firmware and U-Boot read. Provisioning makes it
# writable while it takes files off it. It is nofail: a boot partition slow to appear (the first QEMU boots on a loaded host:
# over 90 s; once 5 min, udev held back) must not put the device in emergency mode; it is
# waited for as long as the data partition, since a first boot's SSH key comes from it. The
# data partition (made at first boot) holds the store and the device's own settings, bound
# where Cairn reads them
# (images/update/cairn-device-settings); fsck (pass 2) repairs it after a power cut, and
# commit=60: ext4 writes a journal commit (~12 KiB) every commit interval in which a file was
# written; SQLite fsyncs what it needs (bench/wear.py mounts the same).
cat > "$R/etc/fstab" <<'EOF'
# <file system>   <mount point>   <type>  <options>  <dump> <pass>
LABEL=CAIRN-BOOT  /boot/firmware  vfat    ro,noatime,umask=0077,nofail,x-systemd.device-timeout=10min  0  0
LABEL=cairn-data  /data           ext4    defaults,noatime,commit=60,nofail,x-systemd.requires=cairn-data-partition.service,x-systemd.device-timeout=10min  0  2
/data/cairn       /var/lib/cairn  none    bind,nofail,x-systemd.requires=cairn-device-settings.service  0  0
/data/etc/cairn   /etc/cairn      none    bind,nofail,x-systemd.requires=cairn-device-settings.service  0  0
/data/etc/NetworkManager/system-connections  /etc/NetworkManager/system-connections  none  bind,nofail,x-systemd.requires=cairn-device-settings.service  0  0
EOF
install -d -m 755 "$R/data"
"$IMAGES/appliance/appliance.sh" "$R"
"$IMAGES/update/install-slot-system.sh" "$R" "${CAIRN_UPDATE_KEYRING:-}"

# -- 4. the system -----------------------------------------------------------------------------
echo "$HOSTNAME_" > "$R/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
    "$HOSTNAME_" > "$R/etc/hosts"

# Network: NetworkManager: wired DHCP by its own default, Wi-Fi and cellular (ModemManager)
# from the profiles provisioning writes (images/provision); DNS through systemd-resolved. The
# profiles are device settings: /etc/NetworkManager/system-connections is bound from the data
# partition (fstab above).
printf '%s\n' '[main]' 'dns=systemd-resolved' 'plugins=keyfile' \
    > "$R/etc/NetworkManager/conf.d/cairn.conf"
systemctl --root="$R" disable systemd-networkd.service systemd-networkd.socket 2> /dev/null || true
systemctl --root="$R" enable NetworkManager.service ModemManager.service systemd-resolved.service
ln -sfn /run/systemd/resolve/stub-resolv.conf "$R/etc/resolv.conf"
mkdir -p "$R/etc/systemd/system/NetworkManager.service.d"
printf '%s\n' '[Unit]' '# the profiles: a device setting, bound from the data partition' \
    'RequiresMountsFor=/etc/NetworkManager/system-connections' \
    > "$R/etc/systemd/system/NetworkManager.service.d/cairn.conf"

# A boot or a system that hangs restarts by itself: PID 1 feeds the hardware watchdog
# (bcm2835_wdt, loaded in the initramfs), which resets the board when it stops; a reboot that
# hangs is cut after 10 min. A reset in a trial boot costs that slot one of its tries.
mkdir -p "$R/etc/systemd/system.conf.d"
printf '%s\n' '[Manager]' 'RuntimeWatchdogSec=2min' 'RebootWatchdogSec=10min' \
    > "$R/etc/systemd/system.conf.d/cairn-watchdog.conf"

# SSH by key only, for the admin user (sudo); root has no password and no key.
chroot "$R" useradd --create-home --shell /bin/bash --groups sudo,adm,systemd-journal "$ADMIN"
chroot "$R" passwd --lock root > /dev/null
if [ -n "${CAIRN_ADMIN_PASSWORD:-}" ]; then
    echo "$ADMIN:$CAIRN_ADMIN_PASSWORD" | chroot "$R" chpasswd
fi
install -d -m 700 -o 1000 -g 1000 "$R/home/$ADMIN/.ssh"
printf '%s\n' "${CAIRN_SSH_PUBKEY:-}" | sed '/^$/d' > "$R/home/$ADMIN/.ssh/authorized_keys"
chown 1000:1000 "$R/home/$ADMIN/.ssh/authorized_keys"
chmod 600 "$R/home/$ADMIN/.ssh/authorized_keys"
# provisioning's keys (the boot partition's cairn/authorized_keys) replace these at boot:
# images/update/cairn-device-identity
echo "CAIRN_ADMIN_USER=$ADMIN" > "$R/usr/lib/cairn/image.env"
echo "$ADMIN ALL=(ALL) NOPASSWD: ALL" > "$R/etc/sudoers.d/010-cairn-admin"
chmod 440 "$R/etc/sudoers.d/010-cairn-admin"
cat > "$R/etc/ssh/sshd_config.d/cairn.conf" <<'EOF'
# Cairn image: keys only, no root login.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
EOF
# Host keys are made on each device's first boot, on its data partition
# (cairn-device-settings), never shared by every card flashed from this image; this unit is
# the fallback when that partition is missing. `ssh-keygen -A` makes only the missing ones,
# so a first boot cut short during it finishes the set on the next.
rm -f "$R"/etc/ssh/ssh_host_*
cat > "$R/etc/systemd/system/cairn-ssh-host-keys.service" <<'EOF'
[Unit]
Description=SSH host keys of this device (made on first boot)
After=cairn-device-settings.service
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
EOF
systemctl --root="$R" enable cairn-ssh-host-keys.service

# The boot partition. Debian's raspi-firmware copies the Pi firmware and device trees and
# writes config.txt from /etc/default/raspi-*; the firmware then starts U-Boot (u-boot-rpi),
# not the kernel: U-Boot runs boot.scr (images/boot/boot.cmd), which chooses slot A or B and
# loads that slot's own kernel and initrd. The kernel arguments beyond root= and the slot are
# the board's: cairn/bootargs.env. Consoles: the Pi 3/4's mini UART is ttyS1 under Debian's
# kernel (what raspi-firmware's "auto" finds on the device itself).
sed -i -E -e "s|^#?ROOTPART=.*|ROOTPART=PARTUUID=$DISK_ID-02|" \
    -e 's|^#?CONSOLES=.*|CONSOLES="ttyS1,115200 tty0"|' "$R/etc/default/raspi-firmware"
KVER=$(basename "$(ls -d "$R"/lib/modules/* | sort -V | tail -n 1)")
ln -sfn "vmlinuz-$KVER" "$R/boot/vmlinuz"
ln -sfn "initrd.img-$KVER" "$R/boot/initrd.img"
mkdir -p "$R/boot/firmware"
in_chroot env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware "$KVER"
BOOTDIR=$WORK/bootfs
rm -rf "$BOOTDIR" && mv "$R/boot/firmware" "$BOOTDIR" && mkdir "$R/boot/firmware"
rm -f "$BOOTDIR"/vmlinuz* "$BOOTDIR"/initrd.img* "$BOOTDIR/cmdline.txt"
# config.txt: raspi-firmware's settings, but the firmware starts U-Boot instead of a kernel
cat > "$BOOTDIR/config.txt" <<'EOF'
# Cairn: the Raspberry Pi firmware starts U-Boot (u-boot-rpi), whose boot.scr chooses root
# slot A or B and starts that slot's own kernel and initrd (images/boot/boot.cmd in Cairn's
# sources). Written by the image build; system updates leave the boot partition alone.
arm_64bit=1
enable_uart=1
upstream_kernel=1
kernel=u-boot.bin
EOF
cp "$R/usr/lib/u-boot/rpi_arm64/u-boot.bin" "$BOOTDIR/u-boot.bin"
mkimage -A arm64 -T script -C none -d "$IMAGES/boot/boot.cmd" "$BOOTDIR/boot.scr" > /dev/null
mkdir -p "$BOOTDIR/cairn"
echo "cairn_cmdline=console=ttyS1,115200 console=tty0" > "$BOOTDIR/cairn/bootargs.env"
# provisioning: the card's cairn/ folder is read at boot (cairn-provision.service); the
# examples, for a person with a laptop, beside it (never read by the device)
cp -r "$IMAGES/provision" "$BOOTDIR/cairn-example"
printf '%s\r\n' "Put this device's settings in this folder; see ../cairn-example/README.txt." \
    "bootargs.env belongs to the boot loader: leave it." \
    > "$BOOTDIR/cairn/README.txt"
# the boot chooser's state (written into the card's raw sectors below, not into the FAT):
# slot A first with its 3 tries, slot B empty until an update
printf 'BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=0\n' |
    mkenvimage -r -s 0x4000 -o "$WORK/boot-state.env" -

# -- 5. the manifest, the slot's root file system, the image and the bundle ---------------------
VERSION=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$WORK/payload-manifest.json")
NAME=cairn-$VERSION-debian-$SUITE-arm64
BUILD=$(date -u +%Y%m%d%H%M%S)
rm -rf "$OUT/$NAME.boot" && mkdir -p "$OUT/$NAME.boot"
cp "$R/boot/vmlinuz-$KVER" "$OUT/$NAME.boot/vmlinuz"
cp "$R/boot/initrd.img-$KVER" "$OUT/$NAME.boot/initrd.img"
cp "$WORK/u-boot-qemu/usr/lib/u-boot/qemu_arm64/u-boot.bin" "$OUT/$NAME.boot/u-boot-qemu.bin"
chroot "$R" dpkg-query -W -f '${Package}\t${Version}\t${Architecture}\n' > "$WORK/packages.tsv"

# Boot partition: a FAT file system made from the directory (no loop device needed).
rm -f "$WORK/boot.part"
mkfs.vfat -C -F 32 -n CAIRN-BOOT "$WORK/boot.part" $((BOOT_MIB * 1024)) > /dev/null
mcopy -s -i "$WORK/boot.part" "$BOOTDIR"/* ::
# The slot's root file system: ext4 made from the directory (-d), owners, modes and xattrs
# kept; the same file goes into slot A and into the bundle.
used_mib=$(du -sm --apparent-size "$R" | cut -f1)
root_mib=$((used_mib * 11 / 10 + ROOT_SLACK_MIB))
[ "$root_mib" -le "$SLOT_MIB" ] ||
    { say "the root file system ($root_mib MiB) does not fit a slot ($SLOT_MIB MiB)"; exit 1; }
ROOTFS=$OUT/$NAME.rootfs.ext4
rm -f "$ROOTFS"
mkfs.ext4 -q -L cairn-root -d "$R" -E root_owner=0:0 "$ROOTFS" "${root_mib}M"
# The disk: MBR (the Pi firmware reads partition 1), partitions 8 MiB aligned; before the
# first, the boot chooser's state, two copies in raw sectors at 8 and 16 MiB, each in an
# erase block of its own (images/boot/boot.cmd, images/update/cairn-boot-state). Slot B is
# empty (the state gives it no tries) until the first update writes it.
IMG=$OUT/$NAME.img
rm -f "$IMG" "$IMG.xz"
boot_start=$((24 * 2048)); a_start=$((boot_start + BOOT_MIB * 2048)); b_start=$((a_start + SLOT_MIB * 2048))
truncate -s $(((b_start + SLOT_MIB * 2048) * 512)) "$IMG"
sfdisk --quiet "$IMG" <<EOF
label: dos
label-id: 0x$DISK_ID
start=$boot_start, size=$((BOOT_MIB * 2048)), type=c
start=$a_start, size=$((SLOT_MIB * 2048)), type=83
start=$b_start, size=$((SLOT_MIB * 2048)), type=83
EOF
dd if="$WORK/boot.part" of="$IMG" bs=1M seek=$((boot_start / 2048)) conv=notrunc,sparse status=none
dd if="$ROOTFS" of="$IMG" bs=1M seek=$((a_start / 2048)) conv=notrunc,sparse status=none
for state_mib in 8 16; do
    dd if="$WORK/boot-state.env" of="$IMG" bs=1M seek=$state_mib conv=notrunc status=none
done
rm -f "$WORK/boot.part" "$WORK/boot-state.env"

if [ "$BUNDLE" = 1 ]; then
    # A RAUC bundle of the same slot: dm-verity format, signed with the builder's key.
    B=$WORK/bundle
    rm -rf "$B" "$OUT/$NAME.raucb" && mkdir -p "$B"
    ln "$ROOTFS" "$B/rootfs.ext4" 2>/dev/null || cp --sparse=always "$ROOTFS" "$B/rootfs.ext4"
    cat > "$B/manifest.raucm" <<EOF
[update]
compatible=$COMPATIBLE
version=$VERSION
description=Cairn $VERSION, Debian $SUITE arm64, kernel $KVER
build=$BUILD

[bundle]
format=verity

[image.rootfs]
filename=rootfs.ext4
EOF
    rauc bundle --cert="$CAIRN_BUNDLE_CERT" --key="$CAIRN_BUNDLE_KEY" "$B" "$OUT/$NAME.raucb" >&2
    rm -rf "$B"
fi

"$PYTHON" - "$OUT/$NAME.manifest.json" "$IMG" "$WORK/packages.tsv" "$WORK/payload-manifest.json" \
    "$BASE" "$DISK_ID" "$KVER" "$OUT/$NAME.boot" "$SUITE" "$BUILD" "$COMPATIBLE" "$ROOTFS" \
    "$OUT/$NAME.raucb" "$WORK/packages-base.tsv" "$WORK/packages-updated.tsv" <<'EOF'
import hashlib, json, sys
from pathlib import Path
(out, img, packages, payload, base, disk_id, kver, boot, suite, build, compatible, rootfs,
 bundle, base_packages, updated_packages) = sys.argv[1:]
def versions(path):
    return dict(line.split("\t") for line in Path(path).read_text().splitlines())
before, after = versions(base_packages), versions(updated_packages)
updates = [{"name": name, "from": before.get(name), "to": version}
           for name, version in sorted(after.items()) if before.get(name) != version]
updates += [{"name": name, "from": version, "to": None}
            for name, version in sorted(before.items()) if name not in after]
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
payload = json.loads(Path(payload).read_text())
Path(out).write_text(json.dumps({
    "image": Path(img).name, "sha256": sha(img), "size": Path(img).stat().st_size,
    "debian": suite, "architecture": "arm64", "kernel": kver,
    "build": build, "compatible": compatible, "disk_id": disk_id,
    "slots": {"A": f"PARTUUID={disk_id}-02", "B": f"PARTUUID={disk_id}-03"},
    "rootfs": {"file": Path(rootfs).name, "sha256": sha(rootfs)},
    "bundle": ({"file": Path(bundle).name, "sha256": sha(bundle)}
               if Path(bundle).exists() else None),
    "base_cache": Path(base).name,
    "debian_updates": updates,   # what the build took beyond the cached base (step 1b)
    "cairn": {"version": payload["version"], "commit": payload.get("commit"),
              "wheel": payload.get("wheel")},
    "boot_files": {p.name: sha(p) for p in sorted(Path(boot).iterdir())},
    "packages": [dict(zip(("name", "version", "architecture"), line.split("\t")))
                 for line in Path(packages).read_text().splitlines()],
    "payload_files": payload.get("files", []),
}, indent=1) + "\n")
EOF
if [ "$XZ" = 1 ]; then
    say "compressing (xz)"
    xz -T0 -6 -f "$IMG"
    (cd "$OUT" && sha256sum "$NAME.img.xz" > "$NAME.img.xz.sha256")
fi
say "done in $(($(date +%s) - started)) s:"
ls -l "$OUT" >&2
echo "$OUT/$NAME"
