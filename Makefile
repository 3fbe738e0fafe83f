# `make demo` and `make test` set everything up on a fresh machine (Python 3.10+,
# a C++ compiler, CMake; nvcc optional) and run the demo / the whole test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed
CI_STAMP := $(VENV)/.ci-deps-installed
# Build trees live outside the source tree, one per checkout (keyed by its path), so
# several checkouts never share a CMake cache and rebuilds stay incremental.
CACHE_HOME ?= $(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME),$(HOME)/.cache)
BUILD_ROOT ?= $(CACHE_HOME)/xlakern-build/$(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)

.PHONY: demo test install pytest cpp-test bench clean docs wheel

$(DEPS_STAMP): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	# BrainEvent 0.3.0, the reference of tests/test_brainevent_differential.py, and brainstate 0.6.0, whose
	# event layers tests/test_network.py runs on both (xlakern imports neither). They declare Python >= 3.12,
	# but their Python code runs on 3.11 (not checked on 3.10, where those tests skip); what they need is
	# installed above.
	if $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
	  $(PY) -m pip install -q --no-deps --ignore-requires-python brainevent==0.3.0 brainstate==0.6.0; fi
	touch $@

# Rebuilt every time: scikit-build-core keeps $(BUILD_ROOT) so only changed files recompile.
install: $(DEPS_STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=$(BUILD_ROOT)/{wheel_tag} .

demo: install
	$(PY) demo/demo.py

cpp-test:
	cmake -S tests/cpp -B $(BUILD_ROOT)/cpptests -DCMAKE_BUILD_TYPE=Release > /dev/null
	cmake --build $(BUILD_ROOT)/cpptests -j 2
	ctest --test-dir $(BUILD_ROOT)/cpptests --output-on-failure

pytest: install
	$(PY) -m pytest -q tests

test: cpp-test pytest

bench: install
	$(PY) bench/bench_foundation.py
	$(PY) bench/bench_numba.py
	$(PY) bench/bench_primitive.py
	$(PY) bench/bench_zeroed.py
	$(PY) bench/bench_event.py
	$(PY) bench/bench_build.py

# Docs and wheel checks (CI runs them after `make test`); their tools are in requirements-ci.txt.
$(CI_STAMP): requirements-ci.txt $(DEPS_STAMP)
	$(PY) -m pip install -q -r requirements-ci.txt
	touch $@

# The API reference from the docstrings; any Sphinx warning fails the build.
docs: install $(CI_STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs $(BUILD_ROOT)/docs-html
	@echo "API reference: $(BUILD_ROOT)/docs-html/index.html"

# A wheel, repaired into a manylinux one by auditwheel (which also checks its symbols).
wheel: install $(CI_STAMP)
	rm -rf dist
	$(PY) -m pip wheel -q --no-build-isolation --no-deps -Cbuild-dir=$(BUILD_ROOT)/{wheel_tag} -w dist/raw .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist dist/raw/xlakern-*.whl
	$(VENV)/bin/auditwheel show dist/xlakern-*manylinux*.whl
	$(PY) tools/check_wheel.py dist/xlakern-*manylinux*.whl

clean:
	rm -rf build dist $(VENV) $(BUILD_ROOT)
