"""The load generator: requests and their timing, when they go, the workload's prompts, what is measured."""
