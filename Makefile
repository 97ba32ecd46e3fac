# The two commands: `make demo` and `make test`. Each creates .venv when it is
# missing and installs the project into it, so a fresh machine with Python
# 3.11 needs nothing else.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
HOME_DIR ?= loopledger-data

.PHONY: demo test bench clean venv browser postgres bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

# The project's own modules compiled ahead: where PYTHONDONTWRITEBYTECODE is
# set, every command (and each of the hundreds the tests start) would
# otherwise compile them from source again, about a tenth of a second each
# time. Up-to-date files are skipped, so this costs nothing when run again.
PACKAGES := engine loopledger validators replay datasets ui

bytecode: | $(BIN)/python
	@$(BIN)/python -m compileall -q $(PACKAGES) >/dev/null

demo: $(VENV)/.installed bytecode
	$(BIN)/loopledger demo --home $(HOME_DIR)
	@echo "(loopledger is installed in $(VENV): run '. $(BIN)/activate' first, or call $(BIN)/loopledger)"

# The UI tests drive a real headless Chromium: Debian's package, since a
# browser download of the test tool's own cannot work here.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser:
	@if [ ! -x $(CHROMIUM) ]; then \
		echo "installing Debian's chromium for the UI tests"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

# The PostgreSQL journal is tested against a real server, which the tests
# start themselves (tests/postgres_kit.py) from Debian's server binaries.
postgres:
	@if ! command -v pg_ctl >/dev/null && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
		echo "installing Debian's postgresql for the journal tests"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	fi

# One worker per core, at most four; a test file stays on one worker, so its
# module fixtures are built once. Each worker starts its own PostgreSQL.
TEST_WORKERS ?= auto

test: $(VENV)/.installed-test bytecode browser postgres
	@$(BIN)/python -m compileall -q tests >/dev/null
	LOOPLEDGER_CHROMIUM=$(CHROMIUM) LOOPLEDGER_REQUIRE_POSTGRES=1 $(BIN)/python -m pytest \
		-n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(HOME_DIR) .pytest_cache .hypothesis
