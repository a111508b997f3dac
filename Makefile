# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PEERS  := $(VENV)/.peers
BROWSER := $(VENV)/.browser

.PHONY: demo test bench install clean robust docs screenshots

$(PY):
	@$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@echo "setting up $(VENV) (first run only)..."
	@$(PY) -m pip install -q --upgrade pip > $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(PY) -m pip install -q -e '.[test]' >> $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@touch $(STAMP)
	@echo "done (log: $(VENV)/install.log)"

# the peers (dp-accounting, prv-accountant, PLD_accounting) are in the `test` extra, so $(STAMP) installs
# them for `make test` too; `make bench` re-checks them here and adds numba (PLD_accounting's speed-up)
$(PEERS): $(STAMP)
	@$(PY) -c "import dp_accounting, prv_accountant, PLD_accounting, numba" 2>/dev/null || \
	  ( echo "installing the peers for the benchmarks..."; \
	    $(PY) -m pip install -q -e '.[test,peers]' >> $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1) )
	@touch $(PEERS)

install: $(STAMP)

# the suite runs on TEST_WORKERS processes (pytest-xdist; 2 = this machine's and CI's cores); the
# tests that start clusters as subprocesses share one of them (tests/conftest.py)
TEST_WORKERS ?= 2
test: $(STAMP) $(BROWSER)
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

# the browser tests drive the system's Chromium (Debian's package), installed here when it is
# missing and this is root with apt-get; otherwise they are skipped and pytest prints why
$(BROWSER): | $(PY)
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then touch $(BROWSER); \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Chromium for the browser tests (log: $(VENV)/browser.log)..."; \
	  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) > $(VENV)/browser.log 2>&1; \
	  then touch $(BROWSER); else echo "Chromium could not be installed: the browser tests will be skipped"; fi; \
	else echo "Chromium is not installed (apt-get install chromium): the browser tests will be skipped"; fi

# screenshots of the calculator page (DP-SGD headline, a bad input) and its timings -> results/
screenshots: $(STAMP) $(BROWSER)
	@$(PY) -m benchmarks.web

# the user guide (docs/, Sphinx + myst-parser) -> docs/_build/html; `make test` builds it too
# (tests/test_docs.py, warnings as errors, every example executed)
docs: $(STAMP)
	@$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "written: docs/_build/html/index.html"

demo: $(STAMP)
	@$(PY) -m sweeps.demo

bench: $(PEERS)
	@$(PY) -m benchmarks.run
	@$(PY) -m benchmarks.calibration

# long randomised robustness run (mixed cases + the families with independent truths): results/ROBUSTNESS.md
ROBUST_CASES ?= 2000
ROBUST_SEED ?= 3
robust: $(STAMP)
	@mkdir -p results
	@$(PY) -m pldlib.testing.robust --issue-cases --out results/.robust_issue.md || true
	@$(PY) -m pldlib.testing.robust --cases $(ROBUST_CASES) --seed $(ROBUST_SEED) --workers 2 --out results/.robust_random.md || true
	@cat results/.robust_issue.md results/.robust_random.md > results/ROBUSTNESS.md
	@echo "written: results/ROBUSTNESS.md"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
