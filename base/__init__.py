"""The base every part of Cairn stands on: the config toolkit (and the redaction of its
secrets), the console's conventions, whole-file writes, URLs, the clocks and the data
directory. It imports nothing of Cairn."""
