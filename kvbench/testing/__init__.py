"""Test doubles kvbench's own tests and client benchmarks run against: `fakeserver`, an OpenAI-compatible
streaming server with known timing and configurable faults (harness/client/overhead.py measures the client with it)."""
