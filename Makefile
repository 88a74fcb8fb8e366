# Set-up, tests, demo and benchmarks. Everything runs inside .venv, which `make install` creates.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
GSPMDC  = $(VENV)/bin/gspmdc

.PHONY: install test test-slow demo bench paper-scale cost-agreement conformance conformance-xla fuzz clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=68" wheel
	$(PY) -m pip install --quiet -e '.[test,xla]'
	touch $@

test: install
	$(PY) -m pytest

# the long runs over whole corpora (e.g. cost against measurement on every conformance case)
test-slow: install
	$(PY) -m pytest -m slow

demo: install
	$(GSPMDC) compile gspmdc/examples/jax_mlp.hlo -n 8 -o out/jax_mlp.spmd.hlo --dump-dir out/jax_mlp.dumps
	$(GSPMDC) explain out/jax_mlp.spmd.hlo all-reduce
	$(GSPMDC) run gspmdc/examples/jax_mlp.hlo -n 8 --seed 0 --check --outputs out/jax_mlp.out.npz

# bytecode first (as `pip install` writes it), so that start-up figures do not include compiling
# gspmdc's sources where PYTHONDONTWRITEBYTECODE is set
bench: install
	$(PY) -m compileall -q gspmdc ir passes runtime
	$(PY) bench/run.py

# the GSPMD paper's scaling claims for a dense Transformer, 128 ... 2048 devices (docs/paper-scale.md)
paper-scale: install
	$(PY) bench/paper_scale.py --write docs/paper-scale.md

# gspmdc cost against run --profile-json on MPI ranks over the corpora (the table of docs/cost.md)
# (the scorers are test tooling, tests/conformance/score*.py, not part of the installed package)
cost-agreement: install
	cd tests && ../$(PY) -m conformance.score cost

conformance: install
	cd tests && ../$(PY) -m conformance.score parse
	cd tests && ../$(PY) -m conformance.score propagate
	cd tests && ../$(PY) -m conformance.score partition

# gspmdc against XLA itself (needs the [xla] extra, which install brings): CASES random modules from
# SEED, each under both propagation option settings; figures, divergence classes, shrunk examples
CASES ?= 200
SEED  ?= 0
conformance-xla: install
	cd tests && nice ../$(PY) -m conformance.xla --cases $(CASES) --seed $(SEED)

# Fuzzing campaigns (tests/fuzz): PROGRAMS generated valid programs through every command and
# TEXTS mutated texts through the parser, from SEED, on JOBS worker processes, each campaign
# stopping after MINUTES (0: when done); failing inputs go to out/fuzz/<outcome>/. Override on
# the command line: make fuzz TEXTS=1000 PROGRAMS=50 SEED=2 MINUTES=10
PROGRAMS ?= 2000
TEXTS    ?= 100000
JOBS     ?= 2
MINUTES  ?= 0

fuzz: install
	cd tests && nice $(abspath $(PY)) -m fuzz --programs $(PROGRAMS) --texts $(TEXTS) \
		--seed $(SEED) --jobs $(JOBS) --minutes $(MINUTES) --out $(CURDIR)/out/fuzz

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
