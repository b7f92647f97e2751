#!/bin/bash -e
# The appliance around Cairn (data partition, read-only root, journal in RAM): the script
# the Debian image uses too. files/ is images/appliance/ (a symlink in the source tree,
# copied for real into pi-gen's tree by build-image.sh).
files/appliance.sh "${ROOTFS_DIR}"
