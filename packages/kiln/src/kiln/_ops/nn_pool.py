"""nn primitives: pool (placeholder module; filled in by the op-surface work)."""
