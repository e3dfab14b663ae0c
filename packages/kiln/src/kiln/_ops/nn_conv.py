"""nn primitives: conv (placeholder module; filled in by the op-surface work)."""
