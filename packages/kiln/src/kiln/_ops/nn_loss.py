"""nn primitives: loss (placeholder module; filled in by the op-surface work)."""
