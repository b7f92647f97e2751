"""The soak and fault suite (``make soak``): long runs against a real router process.

Not part of ``make test``: pytest's ``testpaths`` is ``tests``. Knobs are environment
variables, see ``soak.knobs``.
"""
