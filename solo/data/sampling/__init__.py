"""Which samples each rank reads: per-sample seeds (seeding.py), the global-batch sampler (sampler.py) and the
stateful data source the trainer iterates (source.py)."""
