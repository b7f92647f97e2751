#!/bin/bash -e
# Runs inside the image. Units that would write to the root, or grow it, are turned off.
systemctl enable cairn-readonly-root.service
systemctl disable rpi-resize.service 2> /dev/null || true
systemctl disable dphys-swapfile.service 2> /dev/null || true
systemctl disable rsyslog.service 2> /dev/null || true
# From trixie on, raspi-config's overlay uses Debian's overlayroot: install it now, so that
# first boot does not need the network.
. /etc/os-release
if [ "${VERSION_CODENAME}" != "bookworm" ]; then
	apt-get install -y --no-install-recommends overlayroot
fi
