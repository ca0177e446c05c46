# Two commands set everything up on a fresh clone:
#   make test   create .venv, install kraftlog with every extra, run the whole suite
#   make run    create .venv, install, start a single-node cluster (arrives with the broker)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test bench-storage clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

bench-storage: $(STAMP)
	$(VENV)/bin/kraftlog bench storage

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
