"""nccl-tests-style benchmark harness for hfr: collectives.py (what is checked), backends.py (what is
timed), harness.py (the sweep), report.py (what is printed and written)."""
