"""asv benchmarks: thin wrappers over the kvbench library (see asv.conf.json)."""
