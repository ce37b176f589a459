"""The specs (KV dtypes, GPUs, models, eval tasks) and the capacity model over them."""
