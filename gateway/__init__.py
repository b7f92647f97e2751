"""The Cairn WAMP router: its protocol core (``core``), the asyncio shell (``shell``), the store
(``store``) and device operations (``ops``)."""
