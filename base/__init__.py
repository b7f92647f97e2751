"""The base every part of Cairn stands on: the config toolkit, the console's conventions,
whole-file writes, URLs, the clocks and the data directory. It imports nothing of Cairn."""
