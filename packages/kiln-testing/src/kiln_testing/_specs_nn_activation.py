"""Conformance specs of the nn primitives: activation functions, attention and distances (merged into ``_specs.SPECS``)."""

from __future__ import annotations

from kiln_testing._specs import OpSpec

SPECS: dict[str, OpSpec] = {}
