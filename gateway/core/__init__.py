"""The protocol core: plain classes that take parsed WAMP messages and return effects (messages
to send, publications to persist, history pages to read). No I/O: it imports only ``core``,
``base`` and ``formats`` (never asyncio, sqlite3, time or the shell)."""
