"""The device image: its payload and recipe checked here; booted in QEMU with -m appliance (make
appliance-test, root)."""
