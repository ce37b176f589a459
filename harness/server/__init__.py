"""The vLLM server: its lifecycle, what it runs, its /metrics, energy, KV budget, scales."""
