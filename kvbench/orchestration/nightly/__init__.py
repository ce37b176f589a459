"""`kvbench nightly`: one command per rented machine and night.

config    the TOML schema (pydantic, unknown keys rejected) and its checks against kvbench's catalogs
matrix    a machine section expanded into matrix entries (model x workload x SLO, all dtypes per entry)
estimate  minutes, GPU-hours and USD per entry and machine, from the config and the capacity model
orchestrate  the run: history point, matrix through the harness, regression gate, dashboard, summary
shards    a section's night cut into shards for several machines (entries whole, dealt by estimated minutes)
manifest  a shard's folder: its files, its manifest, how a night's new files are found and packed
merge     shard folders back into results/, and the night rebuilt as one machine's (gate, dashboard, summary)
fleet     one SkyPilot task per shard from sky/nightly.yaml, submitted as managed jobs; the budget; fetching
nodes     the nodes of a multi-node server (vLLM over Ray), named in every record
"""
