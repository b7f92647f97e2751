# The two commands of the README: `make run` and `make test`.
.PHONY: run test lint bench soak setup setup-test payload image

run: setup
	.venv/bin/cairn demo

test: setup-test
	.venv/bin/ruff check .
	.venv/bin/pytest

lint: setup-test
	.venv/bin/ruff check .

bench: setup-test  # Cairn vs Crossbar.io and Mosquitto, ~5 min; writes docs/benchmarks.md
	.venv/bin/python -m bench

soak: setup-test  # the soak and fault suite (soak/), ~20 min; not part of `make test`
	.venv/bin/pytest soak -v -s

payload: setup  # the files an image (or an existing Pi) installs: dist/cairn-payload-*.tar.gz
	.venv/bin/python images/build_payload.py --out dist

image: payload  # a Raspberry Pi OS Lite image with Cairn (pi-gen; needs Docker, see images/)
	images/build-image.sh

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh test
