"""Builds hfr._kernels (-O3, SIMD for this CPU, its own pthread pool), hfr._wait, hfr._internode, hfr._spin,
hfr._cuda, hfr._node_call and hfr._front."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# hfr is built where it runs (pip install -e .), so it may use every SIMD extension of this CPU;
# HFR_NATIVE=0 builds a portable binary (for wheels).
arch_flags = ["-march=native"] if os.environ.get("HFR_NATIVE", "1") != "0" else []

kernels = Extension(
    "hfr._kernels",
    ["hfr/_kernels.pyx"],
    include_dirs=[numpy.get_include()],
    extra_compile_args=["-O3", "-pthread"] + arch_flags,
    extra_link_args=["-pthread"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

# The dbtree's pipeline in C; MPI's functions are looked up at import, so no MPI headers are needed here.
internode = Extension("hfr._internode", ["hfr/_internode.pyx"], include_dirs=[numpy.get_include()], extra_compile_args=["-O2"],
                 define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])

# What every wait looks at besides its condition: pending signals, a cancelled call.
wait = Extension("hfr._wait", ["hfr/_wait.pyx"], extra_compile_args=["-O2"])

# Waits on the node's counters with the GIL released (hfr/engine.py falls back to Python polling).
spin = Extension("hfr._spin", ["hfr/_spin.pyx"], extra_compile_args=["-O2"])

# A CUDA array's copies to and from page-locked memory in C; the CUDA driver's functions are looked up at run
# time, so no CUDA is needed here.
cuda = Extension("hfr._cuda", ["hfr/_cuda.pyx"], extra_compile_args=["-O2"])

# A call that fits in one chunk, in C: host arrays, CUDA arrays staged through hfr._cuda, across nodes
# polling hfr._internode's schedules (hfr/engine.py runs the others).
node_call = Extension("hfr._node_call", ["hfr/_node_call.pyx"], extra_compile_args=["-O2"])

# The calling thread's side of the engine: admission, and a blocking allreduce of one chunk, in C.
front = Extension("hfr._front", ["hfr/_front.pyx"], include_dirs=[numpy.get_include()], extra_compile_args=["-O2"],
                  define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])

setup(
    ext_modules=cythonize(
        [kernels, wait, internode, spin, cuda, node_call, front],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
