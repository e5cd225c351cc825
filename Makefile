# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
# The test ladder: `make check` (lint and the server-free tests, seconds, no root),
# `make test-core` (the core on the embedded PostgreSQL, in parallel, about two minutes),
# `make test` (everything, in parallel: what .ci/run calls).
PYTHON ?= python3
VENV ?= .venv
# pytest-xdist workers: one per core (each starts its own PostgreSQL and, for Spark tests, JVM).
WORKERS ?= auto
PYTEST = $(VENV)/bin/pytest -p no:cacheprovider

.PHONY: demo test test-core check lint ui bench browser server java clean

# uv installs in parallel what pip installs one file at a time (42 s against 65 s on a fresh clone
# here, byte-compiled as pip does); where uv cannot be had or cannot install, pip does it all.
UV_VERSION = 0.13.10
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv==$(UV_VERSION) \
		&& $(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode -e '.[test]' \
		|| $(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/backfill-assets demo

# The screenshot test drives Debian's chromium (headless, loopback only); install it if missing.
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The bounded-waits matrix also runs on the machine's own PostgreSQL with default settings
# (Debian's package, started by the test itself on a Unix socket); install it if missing.
server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# The Spark tests start a local session on a Java runtime (17); install one if missing.
java:
	@command -v java >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	@test -f /usr/share/java/postgresql.jar || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null; }

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check backfill_assets backfill_assets_tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

# BACKFILL_TEST_SERVER_FREE: a test of this tier that starts a server or a JVM fails (conftest);
# BACKFILL_TEST_NO_JVM in test-core: one that launches a JVM fails.
check: lint
	BACKFILL_TEST_SERVER_FREE=1 $(PYTEST) -q -n $(WORKERS) -m "not postgres and not spark"

test-core: $(VENV)/.installed
	BACKFILL_TEST_NO_JVM=1 $(PYTEST) -q -n $(WORKERS) --dist worksteal backfill_assets_tests/core backfill_assets_tests/cli \
		-m "not spark and not slow" --durations=10

# --durations prints the slowest tests at the end; worksteal keeps every worker busy to the end.
test: $(VENV)/.installed browser server java
	$(PYTEST) -n $(WORKERS) --dist worksteal --durations=15

bench: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/bench.py

# UI_PORT: the UI's port on 127.0.0.1.
UI_PORT ?= 3000
ui: $(VENV)/.installed
	$(VENV)/bin/backfill-assets ui --port $(UI_PORT)

clean:
	rm -rf $(VENV) .backfill_assets .pytest_cache .hypothesis
