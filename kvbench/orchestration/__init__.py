"""What starts runs: measure (a plan run with its verdict), the asv suite and its runner, the nightly."""
