# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test ui clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/backfill-assets demo

test: $(VENV)/.installed
	$(VENV)/bin/pytest

ui: $(VENV)/.installed
	$(VENV)/bin/backfill-assets ui

clean:
	rm -rf $(VENV) .backfill_assets .pytest_cache .hypothesis
