# Two commands set everything up on a fresh clone:
#   make test   create .venv, install kraftlog with every extra, run the whole suite
#   make run    create .venv, install, start a single-node cluster (configs/single-node.toml)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test chaos bench-storage bench-controller spark-example clean debian-tools console-screenshots

install: $(STAMP)

$(STAMP): pyproject.toml protocol/_columns.c protocol/_kafka.c storage/_records.c storage/_records.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	rm -f protocol/_columns.*.so protocol/_kafka.*.so storage/_records.*.so  # an edited extension is rebuilt
	$(PY) -m pip install --quiet -e '.[spark,test]'
	touch $(STAMP)

# One combined node (controller + broker) on 127.0.0.1:9092 (broker) and :9093
# (controller), data under ./data/node-1. Ctrl-C stops it gracefully.
run: $(STAMP)
	$(VENV)/bin/kraftlog node --config configs/single-node.toml

# The Spark example pipeline (spark_source/example.py) against the node `make
# run` started: demo clicks, clicks per user per minute to the topic
# clicks-per-minute (exactly once) and to Parquet under ./data/spark-example.
# More flags: make spark-example ARGS="--follow".
spark-example: $(STAMP)
	$(PY) -m spark_source.example $(ARGS)

# Two pytest-xdist workers, a test file at a time each; the chaos scenarios
# and the Spark tests are one unit, handed out first (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP) debian-tools
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

# Every chaos scenario for CHAOS_DURATION seconds each (10 minutes by default;
# about 2 h in all), then a fuzz campaign as long; results, reports and
# node logs under CHAOS_OUT. Stops at the first scenario whose checker fails.
CHAOS_DURATION ?= 600
CHAOS_OUT      ?= chaos-runs
CHAOS_SCENARIOS := kill-leader kill-random kill-two kill-controller restart-cluster pause \
	pause-kill rolling-restart partition disk clock power power-all membership mixed
chaos: $(STAMP)
	@mkdir -p $(CHAOS_OUT)
	@for scenario in $(CHAOS_SCENARIOS); do \
	  echo "== chaos $$scenario for $(CHAOS_DURATION) s"; \
	  $(VENV)/bin/kraftlog chaos run --scenario $$scenario --duration $(CHAOS_DURATION) \
	    --out $(CHAOS_OUT)/$$scenario-$$(date +%s) || exit 1; \
	done
	$(VENV)/bin/kraftlog chaos fuzz --duration $(CHAOS_DURATION) --out $(CHAOS_OUT)/fuzz-$$(date +%s)

# Debian's packages the tests drive: kcat (a Kafka client, for the Kafka
# listener's tests) and chromium (the web console's browser tests, through
# Playwright), installed once.
debian-tools:
	@command -v kcat >/dev/null && command -v chromium >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends kcat chromium >/dev/null; }

# The web console's screenshots in docs/console/, taken by its browser tests.
console-screenshots: $(STAMP) debian-tools
	KRAFTLOG_SCREENSHOTS=docs/console $(PY) -m pytest -q tests/integration/test_console.py

bench-storage: $(STAMP)
	$(VENV)/bin/kraftlog bench storage

bench-controller: $(STAMP)
	$(VENV)/bin/kraftlog bench controller

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
