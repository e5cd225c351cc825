# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test ui bench browser server java clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[test]'
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

test: $(VENV)/.installed browser server java
	$(VENV)/bin/pytest

bench: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/bench.py

ui: $(VENV)/.installed
	$(VENV)/bin/backfill-assets ui

clean:
	rm -rf $(VENV) .backfill_assets .pytest_cache .hypothesis
