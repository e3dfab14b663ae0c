"""nn primitives: activation (placeholder module; filled in by the op-surface work)."""
