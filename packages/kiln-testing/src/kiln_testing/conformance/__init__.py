"""The conformance suite: test modules collected by ``pytest --kiln-device=NAME``."""
