"""kvbench: measured answers to what a KV-cache precision buys on each GPU."""

__version__ = "0.1.0"
