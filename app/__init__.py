"""The ``cairn`` command: it gathers the commands of gateway, drivers, sync and central, so it
sits above them all and none of them imports it; and the checks of every section of
``cairn.toml`` (app.sections)."""
