#!/bin/bash -e
# Runs inside the image. From trixie on, raspi-config's overlay uses Debian's overlayroot:
# install it now, so that first boot does not need the network.
. /etc/os-release
if [ "${VERSION_CODENAME}" != "bookworm" ]; then
	apt-get install -y --no-install-recommends overlayroot
fi
