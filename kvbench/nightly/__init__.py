"""`kvbench nightly`: one command per rented machine and night.

config    the TOML schema (pydantic, unknown keys rejected) and its checks against kvbench's catalogs
matrix    a machine section expanded into matrix entries (model x workload x SLO, all dtypes per entry)
estimate  minutes, GPU-hours and USD per entry and machine, from the config and the capacity model
orchestrate  the run: history point, matrix through the harness, regression gate, dashboard, summary
"""
