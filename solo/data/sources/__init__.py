"""Where samples come from: the datasets registry and its typed configs (registry.py), image datasets (images.py),
image-text pairs (pairs.py) and WebDataset shards (shards.py). A source indexes (image, label) or pairs and knows
nothing of views or ranks."""
