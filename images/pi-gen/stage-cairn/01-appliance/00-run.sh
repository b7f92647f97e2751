#!/bin/bash -e
# The appliance around Cairn: the data partition (made on first boot, mounted noatime at
# /var/lib/cairn), a read-only root (overlay, turned on at the end of first boot), and a
# journal in RAM.
install -D -m 755 files/cairn-data-partition "${ROOTFS_DIR}/usr/lib/cairn/cairn-data-partition"
install -D -m 755 files/cairn-readonly-root "${ROOTFS_DIR}/usr/lib/cairn/cairn-readonly-root"
install -m 644 files/cairn-data-partition.service files/cairn-readonly-root.service \
	"${ROOTFS_DIR}/usr/lib/systemd/system/"
install -D -m 644 files/journald.conf "${ROOTFS_DIR}/etc/systemd/journald.conf.d/cairn.conf"

# /var/lib/cairn is the data partition. x-systemd.requires makes its mount wait for the
# first-boot service that creates it; fsck (pass 2) repairs it after a power cut. commit=60:
# ext4 writes a journal commit (~12 KiB) every commit interval in which a file was written,
# and the store writes every few seconds; SQLite fsyncs what it needs, so only metadata of
# unsynced writes can be up to a minute old after a power cut (bench/wear.py mounts the same).
install -d -m 755 "${ROOTFS_DIR}/var/lib/cairn"
if ! grep -q "LABEL=cairn-data" "${ROOTFS_DIR}/etc/fstab"; then
	printf '%s\n' "LABEL=cairn-data  /var/lib/cairn  ext4  defaults,noatime,commit=60,x-systemd.requires=cairn-data-partition.service  0  2" \
		>> "${ROOTFS_DIR}/etc/fstab"
fi

# Leave the card's free space to the data partition: no growing of the root on first boot
# ("resize" on current images; init=.../firstboot did it on earlier bookworm ones).
CMDLINE="${ROOTFS_DIR}/boot/firmware/cmdline.txt"
sed -i -E -e 's/(^| )resize( |$)/\1\2/' \
	-e 's#(^| )init=/usr/lib/raspberrypi-sys-mods/firstboot( |$)#\1\2#' \
	-e 's/  +/ /g' -e 's/ $//' "${CMDLINE}"

# Read-only root unless the build says otherwise (CAIRN_READONLY_ROOT=0 in the config).
if [ "${CAIRN_READONLY_ROOT:-1}" = "1" ]; then
	install -D -m 644 /dev/null "${ROOTFS_DIR}/etc/cairn/readonly-root"
else
	rm -f "${ROOTFS_DIR}/etc/cairn/readonly-root"
fi
