"""Every code block of README.md runs as written: each python block on 2 ranks under mpiexec, each shell
block in a scratch folder as a reader runs it in the clone, after `source .venv/bin/activate` (.venv being
this Python's environment, and a python block whose first line is `# NAME.py` saved there as NAME.py).
Shell blocks that run make (it would start this test run again) or pip (it needs the network) are left
out."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .mpirun import REPO, run_mpi

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
BLOCKS = BLOCK.findall((REPO / "README.md").read_text())
PYTHON = [code for language, code in BLOCKS if language == "python"]
SHELL = [code for language, code in BLOCKS if language == "sh"]
LEFT_OUT = re.compile(r"^\s*(\S*/)?(make|pip)\b", re.MULTILINE)


def file_name(code: str) -> str:
    """NAME.py for a block that starts `# NAME.py`, else block.py."""
    first = re.match(r"# (\w+\.py)\n", code)
    return first.group(1) if first else "block.py"


@pytest.mark.parametrize("code", PYTHON, ids=[f"python{i}" for i in range(len(PYTHON))])
def test_python_block_runs_on_two_ranks(code, tmp_path):
    if re.search(r"^import (hfr\.)?torch", code, re.MULTILINE):
        pytest.importorskip("torch")
    script = tmp_path / file_name(code)
    script.write_text(code)
    run_mpi(2, str(script), timeout=120)


def runnable(code: str) -> bool:
    return not LEFT_OUT.search(code)


@pytest.mark.parametrize("code", [c for c in SHELL if runnable(c)],
                         ids=[f"sh{i}" for i, c in enumerate(SHELL) if runnable(c)])
def test_shell_block_runs(code, tmp_path):
    (tmp_path / ".venv").symlink_to(sys.prefix)
    for block in PYTHON:
        if file_name(block) != "block.py":
            (tmp_path / file_name(block)).write_text(block)
    env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "HFR_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_every_block_is_python_or_sh():
    """A block in another language would go untested."""
    assert {language for language, _ in BLOCKS} == {"python", "sh"}
