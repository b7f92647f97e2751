"""The Cairn WAMP router: protocol core, transports and store."""
