# `make demo` and `make test` set everything up on a fresh machine (Python 3.10+,
# a C++ compiler, CMake; nvcc optional) and run the demo / the whole test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-installed

.PHONY: demo test install pytest cpp-test bench clean

$(DEPS_STAMP): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# Rebuilt every time: scikit-build-core keeps build/ so only changed files recompile.
install: $(DEPS_STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps .

demo: install
	$(PY) demo/demo.py

cpp-test:
	cmake -S tests/cpp -B build/cpptests -DCMAKE_BUILD_TYPE=Release > /dev/null
	cmake --build build/cpptests -j 2
	ctest --test-dir build/cpptests --output-on-failure

pytest: install
	$(PY) -m pytest -q tests

test: cpp-test pytest

bench: install
	$(PY) bench/bench_foundation.py
	$(PY) bench/bench_numba.py
	$(PY) bench/bench_primitive.py
	$(PY) bench/bench_build.py

clean:
	rm -rf build $(VENV)
