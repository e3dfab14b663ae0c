"""nn primitives: norm (placeholder module; filled in by the op-surface work)."""
