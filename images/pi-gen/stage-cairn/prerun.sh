#!/bin/bash -e
# pi-gen convention: start this stage from a copy of the previous stage's root (stage2, the
# Raspberry Pi OS Lite root), unless a rerun left one here.
if [ ! -d "${ROOTFS_DIR}" ]; then
	copy_previous
fi
