"""What the model sees: view recipes (transforms.py), their per-sample parameters and batched pixel operations
(augment.py), and the dataset wrappers that make a sample's views (multiview.py) or image-text samples (image_text.py),
seeded by (seed, epoch, index) alone."""
