# make bench: set up .venv and run the allreduce benchmark (NumPy arrays, 4 ranks)
# make test:  set up .venv and run every test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
BENCH_ARGS ?= -b 16 -e 64M -f 4 -n 10 -w 3 --table bench/out/allreduce_numpy.txt --plot bench/out/allreduce_numpy.png --json bench/out/allreduce_numpy.json

.PHONY: setup test bench bench-kernels clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py hfr/_kernels.pyx hfr/_spin.pyx
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,test,bench]'
	touch $@

test: setup
	$(PY) -m pytest -q

bench: setup
	mkdir -p bench/out
	$(VENV)/bin/mpiexec -n $(NP) $(PY) -m mpi4py bench/allreduce_perf.py $(BENCH_ARGS)

bench-kernels: setup
	$(PY) bench/kernels_perf.py

clean:
	rm -rf $(VENV) build hfr/_kernels.c hfr/*.so *.egg-info bench/out
