"""The central side: the Spark jobs (``central.spark``), the fleet report, the HTML report, the
table lock and the plain-Python planning the jobs do (``central.plan``). It imports neither
``gateway``, ``drivers`` nor ``sync``: what it shares with the edge is in ``formats``."""
