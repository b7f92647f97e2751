#!/bin/bash -e
# Install Cairn from the payload (images/build_payload.py) with the payload's own install.sh,
# inside the image's root: the same code path as installing on a running Raspberry Pi OS.
# build-image.sh puts the payload at files/cairn-payload.tar.gz.
PAYLOAD=files/cairn-payload.tar.gz
if [ ! -f "${PAYLOAD}" ]; then
	echo "stage-cairn: ${PAYLOAD} is missing: build the image with images/build-image.sh" >&2
	exit 1
fi
rm -rf "${ROOTFS_DIR}/tmp/cairn-payload"
mkdir -p "${ROOTFS_DIR}/tmp/cairn-payload"
tar -xzf "${PAYLOAD}" -C "${ROOTFS_DIR}/tmp/cairn-payload" --strip-components=1 \
	--no-same-owner
on_chroot << EOF2
CAIRN_ENABLE="cairn-router.service" /tmp/cairn-payload/install.sh
EOF2
rm -rf "${ROOTFS_DIR}/tmp/cairn-payload"
