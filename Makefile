# make bench: set up .venv and run the allreduce benchmark (NumPy arrays, 4 ranks)
# make test:  set up .venv and run every test (then the 15 slowest)
# make test-openmpi: the fault tests again under Open MPI (tests/openmpi.sh)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
# torch is optional for hfr; the tests of the DDP hook and the gloo peer of the benchmark need it.
# 2.13.0 is the CPU build this project's machines keep on disk (elsewhere PyPI's torch is the CUDA build,
# several GB: README.md, PyTorch, says how to get the CPU one); `make TORCH_SPEC= test` goes without.
TORCH_SPEC ?= torch==2.13.0
BENCH_ARGS ?= -b 16 -e 64M -f 4 -n 10 -w 3 --table bench/out/allreduce_numpy.txt --plot bench/out/allreduce_numpy.png --json bench/out/allreduce_numpy.json

.PHONY: setup test test-openmpi bench bench-kernels clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(wildcard hfr/*.pyx hfr/*.pxd)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,test,bench]'
	$(if $(TORCH_SPEC),$(PY) -m pip install -q '$(TORCH_SPEC)')
	touch $@

test: setup
	$(PY) -m pytest -q --durations=15

test-openmpi: setup
	PYTHON=$(PYTHON) bash tests/openmpi.sh

bench: setup
	mkdir -p bench/out
	$(VENV)/bin/mpiexec -n $(NP) $(PY) -m mpi4py bench/allreduce_perf.py $(BENCH_ARGS)

bench-kernels: setup
	$(PY) bench/kernels_perf.py

clean:
	rm -rf $(VENV) .venv-openmpi build hfr/*.c hfr/*.so *.egg-info bench/out
