# Thin wrappers; each target works on a fresh machine by itself.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup run test lint bench clean

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -e '.[dev]'
	touch $@

setup: .venv/.installed

run: setup
	$(PY) -m services.blobnode -c deploy/blobnode.json

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check .

bench: setup
	$(PY) bench/ec_codec.py
	$(PY) bench/blobnode.py

clean:
	rm -rf .venv run bench/results
