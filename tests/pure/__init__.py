"""Plain values and files: no router, socket, process, SQLite store or Spark; the whole tier runs
in seconds (and without PySpark)."""
