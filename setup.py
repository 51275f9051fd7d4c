"""Builds hfr._kernels with -O3, and with OpenMP where the compiler has it."""
import os
import subprocess
import sys
import sysconfig
import tempfile

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def compiler_has_openmp() -> bool:
    """True when the C compiler that builds extensions compiles and links -fopenmp."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n")
        cmd = cc + ["-fopenmp", src, "-o", os.path.join(tmp, "omp")]
        return subprocess.run(cmd, capture_output=True).returncode == 0


openmp = os.environ.get("HFR_OPENMP", "auto") != "0" and compiler_has_openmp()
if not openmp:
    print("hfr: building _kernels without OpenMP (single-threaded kernels)", file=sys.stderr)
omp_flags = ["-fopenmp"] if openmp else []
# hfr is built where it runs (pip install -e .), so it may use every SIMD extension of this CPU;
# HFR_NATIVE=0 builds a portable binary (for wheels).
arch_flags = ["-march=native"] if os.environ.get("HFR_NATIVE", "1") != "0" else []

kernels = Extension(
    "hfr._kernels",
    ["hfr/_kernels.pyx"],
    include_dirs=[numpy.get_include()],
    extra_compile_args=["-O3"] + arch_flags + omp_flags,
    extra_link_args=omp_flags,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

# Waits on the node's counters with the GIL released (hfr/engine.py falls back to Python polling).
spin = Extension("hfr._spin", ["hfr/_spin.pyx"], extra_compile_args=["-O2"])

setup(
    ext_modules=cythonize(
        [kernels, spin],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
