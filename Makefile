# One target per job; the README, .ci/run and developers all call these.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo prereqs test test-unit test-integration faults faults-full lint types bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,bench]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)  ## a durable run end to end: embedded Redis, a worker, the simulator, an ask answered
	$(VENV)/bin/toolloop demo --answer "Keep shot 3; trim shot 5 by a second."

prereqs:  ## the programs the suite runs (tests/prereqs.py): names what is missing and its install command
	@python3 tests/prereqs.py

TEST_PROCESSES ?= 2

test: prereqs $(STAMP)  ## unit, replay, integration and the bounded fault suite, on TEST_PROCESSES pytest processes
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist worksteal --durations=15

test-unit: $(STAMP)  ## the unit and replay tiers: in-process, no outside program (under a minute)
	$(PY) -m pytest -q tests/unit tests/replay

test-integration: prereqs $(STAMP)
	$(PY) -m pytest -q tests/integration

faults: prereqs $(STAMP)  ## the bounded reliability suite (every kill point, 2 runs each; ~4 min); prints its tables
	$(PY) -m pytest -q -s tests/faults

faults-full: prereqs $(STAMP)  ## the full crash matrix (>= 10 kill points x 20 runs), Flower on Sentinel; prints its table
	TOOLLOOP_FAULTS=full $(PY) -m pytest -q -s tests/faults tests/integration/test_flower_sentinel.py

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

types: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)  ## every benchmark; each prints ours beside its peer or floor
	$(PY) bench/loop_overhead.py
	$(PY) bench/prompt_cache.py
	$(PY) bench/durable.py
	$(PY) bench/enqueue.py
	$(PY) bench/fleet.py
	$(PY) bench/flow.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
