#!/bin/bash
# The A/B system of the Debian image, applied to a slot's root file system after
# images/appliance/appliance.sh: RAUC's config (two root slots, U-Boot's state on the boot
# partition), the device's settings on the data partition (outside both slots), the health
# gate, and a root that is a read-only overlay from the very first boot (nothing on a slot is
# ever written on the device: an update replaces the whole slot).
#
#   images/update/install-slot-system.sh ROOTFS [KEYRING.pem]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
R=${1:?usage: install-slot-system.sh ROOTFS [KEYRING.pem]}
KEYRING=${2:-}

install -D -m 644 "$HERE/system.conf" "$R/etc/rauc/system.conf"
# the boot chooser's state: where this card keeps it is found at boot (cairn-boot-state), and
# RAUC runs only once it is
ln -sfn /run/cairn-boot-state/fw_env.config "$R/etc/fw_env.config"
mkdir -p "$R/usr/lib/systemd/system/rauc.service.d"
printf '%s\n' '[Unit]' 'Requires=cairn-boot-state.service' 'After=cairn-boot-state.service' \
	> "$R/usr/lib/systemd/system/rauc.service.d/cairn.conf"
install -D -m 755 "$HERE/cairn-update-installing" "$HERE/cairn-update-installed" \
	"$HERE/cairn-device-settings" "$HERE/cairn-device-identity" "$HERE/cairn-boot-state" \
	-t "$R/usr/lib/cairn/"
install -m 644 "$HERE/cairn-device-settings.service" "$HERE/cairn-health.service" \
	"$HERE/cairn-update-pull.service" "$HERE/cairn-update-usb@.service" "$HERE/cairn-ready.service" \
	"$HERE/cairn-boot-state.service" \
	"$HERE/cairn-provision.service" "$HERE/cairn-device-identity.service" \
	"$R/usr/lib/systemd/system/"
install -D -m 644 "$HERE/90-cairn-update-usb.rules" "$R/usr/lib/udev/rules.d/90-cairn-update-usb.rules"
# The update keyring (the CA that signs bundles): the image's default, a device setting from
# the first boot on. Without one, every bundle is refused.
if [ -n "$KEYRING" ]; then
	install -D -m 644 "$KEYRING" "$R/etc/cairn/update/keyring.pem"
fi
systemctl --root="$R" enable cairn-device-settings.service cairn-health.service cairn-ready.service \
	cairn-boot-state.service \
	cairn-update-pull.service cairn-provision.service cairn-device-identity.service

# The overlay root from the first boot on: overlayroot reads this from the slot in the
# initramfs; recurse=0 keeps /boot/firmware and /data real mounts. The first-boot switch of
# the single-root image (cairn-readonly-root) has nothing to do here.
printf '%s\n' '# the slot is a read-only overlay (writes in RAM); recurse=0 keeps /data a real mount' \
	'overlayroot="tmpfs:recurse=0"' > "$R/etc/overlayroot.local.conf"
systemctl --root="$R" disable cairn-readonly-root.service
rm -f "$R/etc/cairn/readonly-root"
