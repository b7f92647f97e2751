"""The ``cairn`` command: it gathers the commands of gateway, drivers and sync, so it sits
above all three and none of them imports it."""

# Every cairn.toml section's check, registered by its owner as it is imported: whatever part
# of the command runs (the router's cairn.admin.config.apply, cairn config apply, cairn
# provision, check-config), a change of the file is checked whole (gateway.core.config.check_whole).
from cairn.app import update_pull as _update_pull  # noqa: F401  [update]
from cairn.sync import cli as _sync_cli  # noqa: F401  [sync]
