# zerodoc developer entry points. `make demo` and `make test` work on a fresh clone:
# they create .venv and install everything they need (torch pinned, CPU build by default).
PYTHON     ?= python3
VENV       ?= .venv
# A GPU user overrides this, e.g. `make test TORCH_SPEC="torch==2.13.0 --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= tui,dev,integrations
ARGS       ?=
PY         := $(VENV)/bin/python
SUDO       := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-fast venv prometheus bench clean hta-extra

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

venv: $(VENV)/.installed

# Prometheus server + promtool, Alertmanager + amtool, VictoriaMetrics + vmagent + vmalert
# (Debian packages) and openssl for the exporter / rules / dashboard / alert delivery / TLS /
# central-store tests.
prometheus:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && \
	  command -v amtool >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 && \
	  { command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null 2>&1 && \
	  command -v victoria-metrics >/dev/null 2>&1 && command -v vmagent >/dev/null 2>&1 && \
	  command -v vmalert >/dev/null 2>&1 || \
	  ( $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install \
	    -y -q prometheus prometheus-alertmanager victoria-metrics openssl )

demo: $(VENV)/.installed
	$(VENV)/bin/zerodoc demo $(ARGS)

# TORCH_SPEC also reaches the packaging test, which installs the built wheel into a fresh venv.
test: $(VENV)/.installed prometheus hta-extra
	OMP_NUM_THREADS=1 TORCH_SPEC="$(TORCH_SPEC)" $(PY) -m pytest $(ARGS)

# The tests that start no process (rules, planner, run log, catalog, report, compare, TUI on
# synthetic runs, argument checks, hostile files): tests/conftest.py marks every test that
# starts one `slow` and fails an unmarked test that does. `make test` still runs everything.
test-fast: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" $(ARGS)

# Holistic Trace Analysis for the trace cross-check (tests/test_trace_hta.py), in a folder of
# its own: it pulls pandas/plotly, which must not change the test venv's numpy or torch.
hta-extra: $(VENV)/hta-extra/hta
$(VENV)/hta-extra/hta: $(VENV)/.installed tests/test_trace_hta.py
	$(PY) -c "from tests.test_trace_hta import HTA_REQUIREMENTS as r; print(' '.join(r))" | \
	  xargs $(PY) -m pip install -q --no-deps --target $(VENV)/hta-extra
	touch $@

bench: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/overhead.py $(ARGS)

clean:
	rm -rf $(VENV) zerodoc-runs .pytest_cache

# Regenerate the generated operations files: Prometheus rules (rules/, rules/two-level/, the
# PrometheusRule in exporters/kubernetes/) from zerodoc/thresholds.py, and the Grafana
# dashboards (dashboards/).
.PHONY: dashboards
dashboards: $(VENV)/.installed
	$(PY) -m zerodoc.cli.rules_gen
	$(PY) -m zerodoc.cli.rules_gen --layout two-level
	$(PY) -m zerodoc.cli.dashboards_gen
