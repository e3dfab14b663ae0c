"""The Tensor methods that op factories made, bound here under their names so that pickle finds them: ``import
kiln`` binds them (``kiln._names.name_bound_functions``), and importing this module imports its package,
``kiln``, first."""
