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
# system: host name, admin user with SSH by key only, network, fstab, boot command line;
# 5. the partitioned image (FAT boot, ext4 root; the data partition is made on first boot in
# the card's free space) and a manifest of package versions and sha256s.
#
# Settings (environment): CAIRN_SSH_PUBKEY, CAIRN_ADMIN_USER (admin), CAIRN_HOSTNAME (cairn),
# CAIRN_CONFIG (a cairn.toml installed as /etc/cairn/cairn.toml instead of the shipped one),
# CAIRN_READONLY_ROOT (1), CAIRN_CACHE (~/.cache/cairn), CAIRN_IMAGE_WORK (build/image/debian).
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
BOOT_MIB=256          # the FAT boot partition (firmware, kernel, initrd, device trees)
ROOT_SLACK_MIB=640    # free space on the root: first-boot files and one upgrade's venv

say() { echo "build-image: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --no-xz) XZ=0; shift ;;
        *) say "unknown argument $1"; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { say "run me as root (mmdebstrap, chroot, file ownership)"; exit 1; }
for tool in mmdebstrap mkfs.vfat mcopy mkfs.ext4 sfdisk xz; do
    command -v "$tool" > /dev/null ||
        { say "$tool is missing: scripts/setup.sh image installs it"; exit 1; }
done
# arm64 programs run on an x86-64 host through qemu-user, registered with binfmt_misc
if [ "$(dpkg --print-architecture)" != arm64 ]; then
    [ -e /proc/sys/fs/binfmt_misc/status ] ||
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
fi
[ -n "${CAIRN_SSH_PUBKEY:-}" ] ||
    say "warning: CAIRN_SSH_PUBKEY is empty: the image will have no way in over SSH"
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

# -- 3. the appliance: the same script as the Raspberry Pi OS image --------------------------
# One MBR disk identifier per build: root=PARTUUID=<id>-02 as Raspberry Pi OS does it.
# /boot/firmware is nofail: only kernel and firmware upgrades need it, and a boot partition
# slow to appear (the first QEMU boots on a loaded host: over 90 s) must not put the device
# in emergency mode, unreachable over SSH.
DISK_ID=$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
cat > "$R/etc/fstab" <<EOF
# <file system>        <mount point>   <type>  <options>                 <dump> <pass>
PARTUUID=$DISK_ID-02   /               ext4    defaults,noatime          0      1
PARTUUID=$DISK_ID-01   /boot/firmware  vfat    defaults,noatime,umask=0077,nofail,x-systemd.device-timeout=5min  0  2
EOF
"$IMAGES/appliance/appliance.sh" "$R"

# -- 4. the system -----------------------------------------------------------------------------
echo "$HOSTNAME_" > "$R/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
    "$HOSTNAME_" > "$R/etc/hosts"

# Network: DHCP on every wired interface; DNS through systemd-resolved.
cat > "$R/etc/systemd/network/20-wired.network" <<'EOF'
[Match]
Type=ether

[Network]
DHCP=yes
EOF
systemctl --root="$R" enable systemd-networkd.service systemd-resolved.service
ln -sfn /run/systemd/resolve/stub-resolv.conf "$R/etc/resolv.conf"

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
echo "$ADMIN ALL=(ALL) NOPASSWD: ALL" > "$R/etc/sudoers.d/010-cairn-admin"
chmod 440 "$R/etc/sudoers.d/010-cairn-admin"
cat > "$R/etc/ssh/sshd_config.d/cairn.conf" <<'EOF'
# Cairn image: keys only, no root login.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
EOF
# Host keys are made on each device's first boot (cairn-readonly-root waits for them), never
# shared by every card flashed from this image. `ssh-keygen -A` makes only the missing ones,
# so a first boot cut short during it finishes the set on the next.
rm -f "$R"/etc/ssh/ssh_host_*
cat > "$R/etc/systemd/system/cairn-ssh-host-keys.service" <<'EOF'
[Unit]
Description=SSH host keys of this device (made on first boot)
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
EOF
systemctl --root="$R" enable cairn-ssh-host-keys.service

# The boot partition: Debian's raspi-firmware writes config.txt and cmdline.txt from
# /etc/default/raspi-*; the root is found by PARTUUID (in the initramfs).
# Consoles: the Pi 3/4's mini UART is ttyS1 under Debian's kernel (what raspi-firmware's
# "auto" finds on the device itself; in a chroot it would probe the build host's /dev).
sed -i -E -e "s|^#?ROOTPART=.*|ROOTPART=PARTUUID=$DISK_ID-02|" \
    -e 's|^#?CONSOLES=.*|CONSOLES="ttyS1,115200 tty0"|' "$R/etc/default/raspi-firmware"
# "ro" (after raspi-firmware's own "rw"; the last word wins): the initramfs mounts the card's
# root read-only, so under the overlay root /media/root-ro stays read-only, as on Ubuntu;
# before the overlay is on, systemd-remount-fs makes / writable from fstab as usual. The file
# outlives kernel upgrades, which rewrite cmdline.txt.
echo ro > "$R/etc/default/raspi-extra-cmdline"
KVER=$(basename "$(ls -d "$R"/lib/modules/* | sort -V | tail -n 1)")
mkdir -p "$R/boot/firmware"
in_chroot env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware "$KVER"
grep -q "root=PARTUUID=$DISK_ID-02" "$R/boot/firmware/cmdline.txt" ||
    { say "raspi-firmware wrote no root=PARTUUID=$DISK_ID-02 into cmdline.txt"; exit 1; }

# -- 5. the manifest and the image ----------------------------------------------------------
VERSION=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$WORK/payload-manifest.json")
NAME=cairn-$VERSION-debian-$SUITE-arm64
mkdir -p "$OUT/$NAME.boot"
cp "$R/boot/vmlinuz-$KVER" "$OUT/$NAME.boot/vmlinuz"
cp "$R/boot/initrd.img-$KVER" "$OUT/$NAME.boot/initrd.img"
cp "$R/boot/firmware/cmdline.txt" "$OUT/$NAME.boot/cmdline.txt"
chroot "$R" dpkg-query -W -f '${Package}\t${Version}\t${Architecture}\n' > "$WORK/packages.tsv"

# Boot partition: a FAT file system made from /boot/firmware (no loop device needed).
BOOTDIR=$WORK/bootfs
rm -rf "$BOOTDIR" && mv "$R/boot/firmware" "$BOOTDIR" && mkdir "$R/boot/firmware"
rm -f "$WORK/boot.part"
mkfs.vfat -C -F 32 -n CAIRN-BOOT "$WORK/boot.part" $((BOOT_MIB * 1024)) > /dev/null
mcopy -s -i "$WORK/boot.part" "$BOOTDIR"/* ::
# Root partition: ext4 made from the directory (-d), owners, modes and xattrs kept.
used_mib=$(du -sm --apparent-size "$R" | cut -f1)
root_mib=$((used_mib * 11 / 10 + ROOT_SLACK_MIB))
rm -f "$WORK/root.part"
mkfs.ext4 -q -L cairn-root -d "$R" -E root_owner=0:0 "$WORK/root.part" "${root_mib}M"
# The disk: MBR (the Pi firmware reads partition 1), 4 MiB aligned as pi-gen does.
IMG=$OUT/$NAME.img
rm -f "$IMG" "$IMG.xz"
boot_start=8192; root_start=$((boot_start + BOOT_MIB * 2048))
truncate -s $(((root_start + root_mib * 2048) * 512)) "$IMG"
sfdisk --quiet "$IMG" <<EOF
label: dos
label-id: 0x$DISK_ID
start=$boot_start, size=$((BOOT_MIB * 2048)), type=c
start=$root_start, size=$((root_mib * 2048)), type=83
EOF
dd if="$WORK/boot.part" of="$IMG" bs=1M seek=$((boot_start / 2048)) conv=notrunc,sparse status=none
dd if="$WORK/root.part" of="$IMG" bs=1M seek=$((root_start / 2048)) conv=notrunc,sparse status=none
rm -f "$WORK/boot.part" "$WORK/root.part"

"$PYTHON" - "$OUT/$NAME.manifest.json" "$IMG" "$WORK/packages.tsv" "$WORK/payload-manifest.json" \
    "$BASE" "$DISK_ID" "$KVER" "$OUT/$NAME.boot" "$SUITE" <<'EOF'
import hashlib, json, sys
from pathlib import Path
out, img, packages, payload, base, disk_id, kver, boot, suite = sys.argv[1:]
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
    "disk_id": disk_id, "root": f"PARTUUID={disk_id}-02", "base_cache": Path(base).name,
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
