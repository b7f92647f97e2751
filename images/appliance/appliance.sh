#!/bin/bash
# The appliance around Cairn, applied to an image's root file system: the data partition
# (made on first boot, mounted noatime at /var/lib/cairn), a read-only root (an overlay,
# turned on at the end of first boot), a journal in RAM, and nothing that writes to the card
# or grows the root. One copy for both images: the Debian one (images/debian/build-image.sh)
# and the Raspberry Pi OS one (pi-gen's stage-cairn/01-appliance/00-run.sh).
#
#   images/appliance/appliance.sh ROOTFS        (CAIRN_READONLY_ROOT=0: keep the root writable)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
R=${1:?usage: appliance.sh ROOTFS}

install -D -m 755 "$HERE/cairn-data-partition" "$R/usr/lib/cairn/cairn-data-partition"
install -D -m 755 "$HERE/cairn-readonly-root" "$R/usr/lib/cairn/cairn-readonly-root"
install -D -m 755 "$HERE/cairn-drivers" "$R/usr/lib/cairn/cairn-drivers"
install -d "$R/usr/lib/systemd/system"
install -m 644 "$HERE/cairn-data-partition.service" "$HERE/cairn-readonly-root.service" \
	"$HERE/cairn-overlay-rw.service" "$HERE/cairn-drivers.service" "$R/usr/lib/systemd/system/"
install -D -m 644 "$HERE/systemd-remount-fs-overlay.conf" \
	"$R/usr/lib/systemd/system/systemd-remount-fs.service.d/cairn-overlay.conf"
install -D -m 644 "$HERE/journald.conf" "$R/etc/systemd/journald.conf.d/cairn.conf"

# /var/lib/cairn is the data partition. x-systemd.requires makes its mount wait for the
# first-boot service that creates it, and device-timeout gives that service as long as its
# own start timeout (systemd's default, 90 s, ran out in the first QEMU boot); nofail: a
# missing data partition stops the router (RequiresMountsFor=), not the boot, so the device
# stays reachable over SSH instead of sitting in emergency mode with root locked. fsck
# (pass 2) repairs it after a power cut. commit=60:
# ext4 writes a journal commit (~12 KiB) every commit interval in which a file was written,
# and the store writes every few seconds; SQLite fsyncs what it needs, so only metadata of
# unsynced writes can be up to a minute old after a power cut (bench/wear.py mounts the same).
install -d -m 755 "$R/var/lib/cairn"
touch "$R/etc/fstab"
if ! grep -q "LABEL=cairn-data" "$R/etc/fstab"; then
	printf '%s\n' "LABEL=cairn-data  /var/lib/cairn  ext4  defaults,noatime,commit=60,nofail,x-systemd.requires=cairn-data-partition.service,x-systemd.device-timeout=10min  0  2" \
		>> "$R/etc/fstab"
fi

# Leave the card's free space to the data partition: no growing of the root on first boot
# ("resize" on current Raspberry Pi OS images; init=.../firstboot did it on earlier bookworm
# ones). Debian's raspi-firmware writes neither.
CMDLINE="$R/boot/firmware/cmdline.txt"
if [ -f "$CMDLINE" ]; then
	sed -i -E -e 's/(^| )resize( |$)/\1\2/' \
		-e 's#(^| )init=/usr/lib/raspberrypi-sys-mods/firstboot( |$)#\1\2#' \
		-e 's/  +/ /g' -e 's/ $//' "$CMDLINE"
fi

# Read-only root unless the build says otherwise (CAIRN_READONLY_ROOT=0).
if [ "${CAIRN_READONLY_ROOT:-1}" = "1" ]; then
	install -D -m 644 /dev/null "$R/etc/cairn/readonly-root"
else
	rm -f "$R/etc/cairn/readonly-root"
fi

# Generators with no job on this device are masked. systemd 257 (trixie) freezes at boot
# when its generators together take over 90 s ("Failed to fork off sandboxing environment for
# executing generators: Protocol error"): seen once in QEMU after a power cut, the last
# generator output being systemd-ssh-generator's vsock probe. The device has sshd, no vsock,
# no TPM, an MBR card with its partitions in fstab and no swap to resume from.
install -d "$R/etc/systemd/system-generators"
for generator in systemd-ssh-generator systemd-tpm2-generator systemd-gpt-auto-generator \
		systemd-hibernate-resume-generator; do
	ln -sfn /dev/null "$R/etc/systemd/system-generators/$generator"
done

# No udev rules come as system credentials here. Its `udevadm control --load-credentials`,
# ordered before udevd, held udevd back for 5 minutes in one QEMU boot (trixie, TCG): every
# device, the boot and data partitions too, waited for it.
ln -sfn /dev/null "$R/etc/systemd/system/systemd-udev-load-credentials.service"

# Units that would write to the card or grow the root are off (those that exist: Raspberry
# Pi OS has all three, Debian's minimal image none).
systemctl --root="$R" enable cairn-readonly-root.service cairn-overlay-rw.service \
	cairn-drivers.service
for unit in rpi-resize.service dphys-swapfile.service rsyslog.service; do
	if [ -n "$(systemctl --root="$R" list-unit-files --no-legend "$unit" 2>/dev/null)" ]; then
		systemctl --root="$R" disable "$unit"
	fi
done
