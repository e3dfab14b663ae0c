"""Conformance specs of the nn primitives: softmax family, normalization, embedding and dropout (merged into ``_specs.SPECS``)."""

from __future__ import annotations

from kiln_testing._specs import OpSpec

SPECS: dict[str, OpSpec] = {}
