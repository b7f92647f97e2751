#!/bin/bash
# Boot a built Cairn image on this machine, in QEMU, the way the appliance tests do: QEMU's
# virt machine (arm64, TCG), U-Boot as its firmware running the image's boot.scr (the A/B
# chooser), the image as a card grown to --disk-mib (first boot makes the data partition in
# the free space). SSH and the router's port are forwarded to loopback ports it prints; the
# console is this terminal (Ctrl-a x quits QEMU).
#
#   images/run-qemu.sh build/image/debian/out/cairn-<v>-debian-trixie-arm64.img[.xz] \
#       [--ssh-port 2222] [--http-port 8080] [--disk-mib 8192] [--fresh] [--provision DIR]
#
# --provision DIR: put DIR's files into the new card's cairn/ folder on its boot partition,
# as you would with a card reader (authorized_keys, cairn.toml, sensors/, network/, ...: see
# the card's cairn-example/ folder); an image built without CAIRN_SSH_PUBKEY needs at least
# an authorized_keys there to be reached over SSH.
#
# The card is kept beside the image (<name>.qemu-disk.img) and booted again next time, as a
# device keeps its card; --fresh starts from the image again. Needs qemu-system-arm, mtools,
# xz and, for an image without its .boot/ directory, u-boot-qemu.
set -euo pipefail
say() { echo "run-qemu: $*" >&2; }

IMAGE=${1:?usage: run-qemu.sh IMAGE [--ssh-port N] [--http-port N] [--disk-mib N] [--fresh] [--provision DIR]}
shift
SSH_PORT=2222 HTTP_PORT=8080 DISK_MIB=8192 FRESH=0 PROVISION=
while [ $# -gt 0 ]; do
    case "$1" in
        --ssh-port) SSH_PORT=$2; shift 2 ;;
        --http-port) HTTP_PORT=$2; shift 2 ;;
        --disk-mib) DISK_MIB=$2; shift 2 ;;
        --fresh) FRESH=1; shift ;;
        --provision) PROVISION=$2; shift 2 ;;
        *) say "unknown argument $1"; exit 2 ;;
    esac
done
[ -f "$IMAGE" ] || { say "no image at $IMAGE"; exit 2; }
name=$(basename "$IMAGE" .xz)
name=${name%.img}
dir=$(cd "$(dirname "$IMAGE")" && pwd)
DISK=$dir/$name.qemu-disk.img
# U-Boot for QEMU: the one the build put beside the image (the release of the Pi's), else
# this machine's
BIOS=$dir/$name.boot/u-boot-qemu.bin
[ -f "$BIOS" ] || BIOS=/usr/lib/u-boot/qemu_arm64/u-boot.bin
[ -f "$BIOS" ] || { say "no U-Boot for QEMU: apt-get install u-boot-qemu"; exit 1; }

if [ "$FRESH" = 1 ] || [ ! -f "$DISK" ]; then
    say "making the card $DISK (${DISK_MIB} MiB)"
    case "$IMAGE" in
        *.xz) xz -dc "$IMAGE" > "$DISK.tmp" ;;
        *) cp --sparse=always "$IMAGE" "$DISK.tmp" ;;
    esac
    truncate -s "${DISK_MIB}M" "$DISK.tmp"
    # the board's kernel arguments (boot.scr adds them): the console on QEMU's PL011
    boot_start=$(partx -g -o START -n 1 "$DISK.tmp" | tr -d ' ')
    printf 'cairn_cmdline=console=ttyAMA0\n' > "$DISK.bootargs"
    mcopy -o -i "$DISK.tmp@@$((boot_start * 512))" "$DISK.bootargs" ::cairn/bootargs.env
    rm -f "$DISK.bootargs"
    if [ -n "$PROVISION" ]; then
        [ -d "$PROVISION" ] || { say "--provision $PROVISION is not a directory"; exit 2; }
        say "provisioning from $PROVISION (applied at first boot: see cairn/report.txt)"
        mcopy -s -o -i "$DISK.tmp@@$((boot_start * 512))" "$PROVISION"/* ::cairn/
    fi
    mv "$DISK.tmp" "$DISK"
fi

say "SSH:       ssh -p $SSH_PORT admin@127.0.0.1   (the key provisioned or built in)"
say "dashboard: ssh -p $SSH_PORT -N -L 8080:127.0.0.1:8080 admin@127.0.0.1, then"
say "           http://127.0.0.1:8080/ (the shipped config listens on the device's loopback;"
say "           a config listening on its LAN answers on http://127.0.0.1:$HTTP_PORT/)"
say "first boot takes a few minutes under emulation; Ctrl-a x quits"
exec qemu-system-aarch64 -M virt -cpu cortex-a72 -smp 2 -m 1024 -nographic \
    -bios "$BIOS" \
    -drive "if=none,id=card,file=$DISK,format=raw" -device virtio-blk-pci,drive=card \
    -netdev "user,id=lan,hostfwd=tcp:127.0.0.1:$SSH_PORT-:22,hostfwd=tcp:127.0.0.1:$HTTP_PORT-:8080" \
    -device virtio-net-pci,netdev=lan -device virtio-rng-pci \
    -device i6300esb -device qemu-xhci,id=usb
