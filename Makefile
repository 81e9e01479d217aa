# The two set-up commands of the README: each creates .venv on first use.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: quickstart test test-fast lint

$(INSTALLED): pyproject.toml constraints.txt scripts/install.sh
	@echo "Installing lightning-zero and its dependencies into $(VENV) first (one time, about 5-15 minutes; it has not hung)..."
	bash scripts/install.sh $(VENV)
	touch $@

quickstart: $(INSTALLED)
	$(PYTHON) main.py fit --config configs/quickstart.yaml

test: $(INSTALLED)
	$(VENV)/bin/ruff check lightning_zero tests examples benchmarks main.py
	$(VENV)/bin/mypy
	$(PYTHON) -m pytest

# The development lane: the tests that start no process and take no more than a few seconds.
test-fast: $(INSTALLED)
	$(PYTHON) -m pytest -m "not multiprocess and not slow"

lint: $(INSTALLED)
	$(VENV)/bin/ruff check lightning_zero tests examples benchmarks main.py
	$(VENV)/bin/ruff format --check lightning_zero tests examples benchmarks main.py
	$(VENV)/bin/mypy
