"""The asyncio shell around the core: listeners and transports, HTTP, flow control and
admission, and carrying out the core's effects on the store."""
