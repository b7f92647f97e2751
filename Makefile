# The two commands of the README: `make run` and `make test`.
.PHONY: run test lint bench soak docs setup setup-test setup-image setup-docs payload image \
	bundle image-pi-gen test-image appliance-test appliance-soak

run: setup
	.venv/bin/cairn demo

test: setup-test
	.venv/bin/ruff check .
	.venv/bin/python -m harness.spark_cds  # the Spark JVMs' class archive, once (~40 s)
	.venv/bin/python -m harness.s3a_jars  # hadoop-aws for the s3a:// tests, once (181 MB)
	.venv/bin/pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25

lint: setup-test
	.venv/bin/ruff check .

bench: setup-test  # Cairn vs Crossbar.io and Mosquitto, ~5 min; writes docs/benchmarks.md
	.venv/bin/python -m bench

docs: setup-docs  # the documentation site from docs/ (MkDocs): open site/index.html, offline
	.venv/bin/mkdocs build --strict

soak: setup-test  # the soak and fault suite (soak/), ~20 min; not part of `make test`
	.venv/bin/pytest soak -v -s

payload: setup  # the files an image (or an existing Pi) installs: dist/cairn-payload-*.tar.gz
	.venv/bin/python images/build_payload.py --out dist

image: setup setup-image  # the SD-card image from Debian's archive (as root): build/image/debian/out/
	images/debian/build-image.sh

# The image and a RAUC bundle of the same build, signed with the builder's key (as root):
#   make bundle CAIRN_BUNDLE_CERT=signer.cert.pem CAIRN_BUNDLE_KEY=signer.key.pem \
#       CAIRN_UPDATE_KEYRING=ca.cert.pem
bundle: setup setup-image
	@[ -n "$$CAIRN_BUNDLE_CERT" ] && [ -n "$$CAIRN_BUNDLE_KEY" ] || \
		{ echo "make bundle: set CAIRN_BUNDLE_CERT and CAIRN_BUNDLE_KEY (images/README.md)" >&2; exit 2; }
	images/debian/build-image.sh

image-pi-gen: payload  # the Raspberry Pi OS Lite variant (pi-gen; needs Docker, see images/)
	images/build-image.sh

# The test image that appliance-test boots, built (or found current) in build/image/ (as root)
test-image: setup-test setup-image
	.venv/bin/python -m tests.appliance.qemu_device

# The image booted in qemu-system-aarch64 and tested from here, as root (.ci/run runs this):
# the virt device (tests/appliance/test_device.py, then a pulled A/B update on the same
# device) and, beside it, the card on QEMU's Raspberry Pi 3 through its own U-Boot
# (test_device_pi.py): scripts/appliance-test.sh. The base root file system is cached in
# ~/.cache/cairn, the test image in build/.
appliance-test: setup-test setup-image
	scripts/appliance-test.sh $(addprefix --deselect ,$(UPDATES_SOAK))

UPDATES = tests/appliance/test_device_update.py
UPDATES_SOAK = $(UPDATES)::test_power_cuts_during_an_install_keep_the_running_slot_and_every_reading \
	$(UPDATES)::test_a_bad_update_that_migrated_the_store_goes_back_with_every_reading \
	$(UPDATES)::test_a_slot_whose_kernel_never_reaches_user_space_is_given_up_by_boot_counting \
	$(UPDATES)::test_a_tampered_bundle_and_one_signed_by_another_key_are_refused

# The slower device cases, not run for every commit (about 90 minutes): every A/B update of
# test_device_update.py (power cuts during an install, a bad update that migrated the store,
# a kernel that never boots, tampered and foreign bundles), test_device_clock.py (a device
# whose clock starts in 2000 and whose link drops), and the power cuts while U-Boot chooses a
# slot and while RAUC writes its state (soak/test_boot_*). One device at a time: two made
# RAUC fail every install on the starved one (images/README.md).
appliance-soak: setup-test setup-image
	.venv/bin/pytest -m appliance -v -s --durations=0 $(UPDATES) \
		tests/appliance/test_device_clock.py soak/test_boot_power_cuts.py \
		soak/test_boot_state_writes.py

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh test

setup-image:
	scripts/setup.sh image

setup-docs:
	scripts/setup.sh docs
