"""Imported by the benchmarks before hfr: puts this checkout's root first on sys.path, so a benchmark
run from another tree (an older commit built in bench/out/before, say) times that tree's hfr and not
the installed one. A script's own folder comes first on sys.path, not the working directory, with
python and python -m mpi4py alike: without this, such A/B runs time the installed hfr twice."""
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
