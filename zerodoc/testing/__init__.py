"""Stand-ins the tests and the benchmarks share (no test framework imported here)."""
