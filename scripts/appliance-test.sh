#!/usr/bin/env bash
# make appliance-test: the test image booted as two devices at once, the virt device
# (tests/appliance/test_device.py, then test_device_update.py's pulled update on the same
# device) and the card on QEMU's Raspberry Pi 3 (test_device_pi.py). One after the other they
# took 65 minutes of a 90-minute CI; side by side the Pi's boot (15 minutes, most of it the
# emulated SD host) runs while the virt device is tested. The Pi's run prints when it ends.
#   scripts/appliance-test.sh [PYTEST ARGS...]    extra arguments go to both runs
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
# built (or found current) once, before either run looks for it
.venv/bin/python -m tests.appliance.qemu_device > build/appliance-image.log 2>&1 || {
    tail -n 60 build/appliance-image.log build/image/debian-test-build.log >&2; exit 1; }

pytest=(.venv/bin/pytest -m appliance -v -s --durations=0 -p no:cacheprovider "$@")
"${pytest[@]}" --basetemp=build/appliance-pi tests/appliance/test_device_pi.py \
    > build/appliance-pi.log 2>&1 &
pi=$!
"${pytest[@]}" --basetemp=build/appliance-virt tests/appliance/test_device.py \
    tests/appliance/test_device_update.py
virt=$?
wait "$pi"
pi_status=$?
echo "=== the Raspberry Pi 3 card (build/appliance-pi.log) ==="
cat build/appliance-pi.log
exit $(( virt != 0 || pi_status != 0 ))
