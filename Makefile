# The two commands: `make demo` and `make test`. Both install what they need from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: test lint typecheck unit install java etcd prometheus chromium bench clean demo cluster-check panel-screenshots

# A venv's bundled setuptools may predate the SPDX `license` string pyproject.toml uses
# (setuptools >= 77), which `setup.py build_ext --inplace` and `python -m build` read.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip 'setuptools>=77'

# Reinstall only when the package metadata or a compiled extension's source changes (the
# editable install builds rda/serialization/_cbinary.*.so, rda/transport/_cframe.*.so and
# rda/transport/_czmq.*.so in place, and the request path's modules compiled from their .py
# and .pxd: rda/transport/protocol.compiled-*.so and the others of rda/_compiled_python.py).
TYPED := $(wildcard rda/*/*.pxd rda/*/*/*.pxd)
$(STAMP): pyproject.toml setup.py rda/serialization/_cbinary.pyx rda/transport/_cframe.pyx rda/transport/_czmq.pyx $(TYPED) $(TYPED:.pxd=.py) | $(BIN)/python
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pip install --quiet -e '.[dev,pipeline,panel,pva]'
	touch $(STAMP)

# Spark (the pipeline extra) needs a Java runtime: install a headless JRE only when `java` is
# missing (apt-get; CI runs as root, elsewhere through sudo). Silent when Java is there.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
java:
	@java -version >/dev/null 2>&1 || { \
		echo "java not found: installing openjdk-17-jre-headless"; \
		$(SUDO) mkdir -p /usr/share/man/man1 && \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			openjdk-17-jre-headless >/dev/null; }

# The metrics tests check the exposition, the alert rules and a real scrape with Prometheus'
# own tools (Debian's prometheus package: prometheus and promtool), installed when missing.
prometheus:
	@{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { \
		echo "promtool/prometheus not found: installing prometheus"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			prometheus >/dev/null; }

# The etcd directory's tests start a real etcd (rda.testing.LocalEtcd, rda/testing/_etcd.py):
# install Debian's etcd-server only when `etcd` is missing, as for Java.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
		echo "etcd not found: installing etcd-server"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			etcd-server >/dev/null; }

# The panel's browser tests (tests/test_panel_browser.py) drive Debian's Chromium through
# Playwright, which is told never to download a browser of its own: install the system one
# only when it is missing, as for Java.
chromium:
	@[ -x /usr/bin/chromium ] || { \
		echo "chromium not found: installing Debian's chromium"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null; }

install: $(STAMP) java etcd chromium

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole tree (pyproject.toml's [tool.mypy] files: package, tests, benchmarks, examples).
typecheck: install
	$(BIN)/mypy --strict

unit: install prometheus
	$(BIN)/pytest

test: lint typecheck unit

demo: install
	BIN=$(BIN) bash examples/demo_cli.sh
	$(BIN)/python examples/demo_session.py
	@echo
	@echo "See the demo in a browser (docs/panel.md):"
	@echo "  $(BIN)/rda serve demo &   then   $(BIN)/rda panel --allow-set"
	@echo "  and open http://127.0.0.1:8080/"

# docs/panel/*.png: the screenshots docs/panel.md shows, taken by the browser tests.
panel-screenshots: install
	RDA_PANEL_SCREENSHOTS=docs/panel $(BIN)/pytest -q tests/test_panel_browser.py

bench: install
	$(BIN)/rda bench

# A Spark standalone master and worker on 127.0.0.1 run examples/history_job.py on a recorded
# store; results must equal History.local's (examples/cluster_check.py). About 2-3 minutes, so
# not part of `make test`.
cluster-check: install
	$(BIN)/python examples/cluster_check.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
	rm -f rda/serialization/_cbinary.c rda/serialization/_cbinary.*.so rda/transport/_cframe.c rda/transport/_cframe.*.so rda/transport/_czmq.c rda/transport/_czmq.*.so
