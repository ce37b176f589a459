"""One run: its settings, defaults and plan, the runner and its phases, the SLO search, comparisons and findings."""
