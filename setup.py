"""Builds hfr._kernels (its own pthread pool) with its tile loops once per SIMD level, hfr._wait, hfr._internode,
hfr._cuda, hfr._node_call and hfr._front."""
import os
import platform
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# The kernels' tile loops (hfr/_tiles.pxi), built once per SIMD level; hfr._kernels runs the best level the
# CPU has, so a build runs on any CPU of its architecture (built on a login node, run on compute nodes).
# HFR_NATIVE=1 builds them once, for this CPU alone (-march=native: every extension it has; it may die of
# SIGILL on another CPU). No FMA contraction: every level gives the same bits.
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
if os.environ.get("HFR_NATIVE", "0") == "1":
    SIMD_LEVELS = {"native": ["-march=native"]}
elif X86:
    SIMD_LEVELS = {
        "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
        "avx2": ["-mavx2", "-mfma", "-mf16c"],
        "baseline": [],
    }
else:
    SIMD_LEVELS = {"baseline": []}
tiles = [Extension(f"hfr._simd_{level}", [f"hfr/_simd_{level}.pyx"], depends=["hfr/_tiles.pxi"],
                   extra_compile_args=["-O3", "-ffp-contract=off"] + flags)
         for level, flags in SIMD_LEVELS.items()]


def simd_levels_header() -> str:
    """build/hfr_simd_levels.h: the levels for hfr._kernels, best first. Rewritten only when they change,
    so that switching HFR_NATIVE in a built tree rebuilds hfr._kernels too."""
    path = Path("build", "hfr_simd_levels.h")
    text = f'#define HFR_SIMD_LEVELS "{" ".join(SIMD_LEVELS)}"\n'
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    return str(path)



kernels = Extension(
    "hfr._kernels",
    ["hfr/_kernels.pyx"],
    include_dirs=[numpy.get_include(), "build"],
    depends=[simd_levels_header()],
    extra_compile_args=["-O3", "-pthread"],
    extra_link_args=["-pthread"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

# The dbtree's pipeline in C; MPI's functions are looked up at import, so no MPI headers are needed here.
internode = Extension("hfr._internode", ["hfr/_internode.pyx"], include_dirs=[numpy.get_include()], extra_compile_args=["-O2"],
                 define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])

# What every wait looks at besides its condition: pending signals, a cancelled call (the wait itself: _wait.pxd).
wait = Extension("hfr._wait", ["hfr/_wait.pyx"], extra_compile_args=["-O2"])

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
        [*tiles, kernels, wait, internode, cuda, node_call, front],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
