"""Quality inside a run: lm-eval tasks under load, agreement, fidelity per token, failure modes, items until decided."""
