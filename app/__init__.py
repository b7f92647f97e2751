"""The ``cairn`` command: it gathers the commands of gateway, drivers and sync, so it sits
above all three and none of them imports it."""
