"""The core layer: what every layer shares (errors, data files, units, output, statistics)."""
