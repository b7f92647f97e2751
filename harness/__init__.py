"""What Cairn's tests, benchmarks and soak runs share (no product code lives here)."""
