"""The protocol core in memory (harness.core): the router driven one message at a time, no sockets,
event loop or store."""
