"""The central jobs on a real local Spark (one session for the run, tests/conftest.py) and a
standalone cluster."""
