"""``cairn provision``: personalise a device from the ``cairn/`` folder on its boot partition.

Run as root at every boot, before the router, the drivers, sshd and NetworkManager. The
folder (see images/provision/README.txt) may hold ``cairn.toml``, ``sensors/*.toml``,
``mqtt/*.toml``, ``secrets/*``, ``authorized_keys``, ``hostname``, ``network/*.toml`` and
``update-keyring.pem``. All of it is checked first, with Cairn's own config checks; if any
of it is bad nothing is applied and the folder is left as it is, to be fixed from a laptop.
Otherwise every file is written into the device's own settings (tmp + fsync + rename, the
replaced files kept in memory to be put back if a write fails midway) and the inputs are
removed from the FAT partition, which anyone who holds the card can read. Either way
``report.txt`` beside them says when, what and why (names only, never a secret's value).

Exit status: 0 applied or nothing to do, 2 refused, 1 a write failed (restored).
"""

from cairn.app.provision.command import add_commands, main

__all__ = ["add_commands", "main"]
