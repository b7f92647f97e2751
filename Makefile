# The two commands of the README: `make run` and `make test`.
.PHONY: run test lint bench setup setup-test

run: setup
	.venv/bin/cairn router

test: setup-test
	.venv/bin/ruff check .
	.venv/bin/pytest

lint: setup-test
	.venv/bin/ruff check .

bench: setup-test
	.venv/bin/python -m bench.pubsub

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh test
