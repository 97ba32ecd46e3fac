"""Offline re-evaluation of recorded traces: validators, loop detectors and
completion gates re-run over stored candidates, without any model call.

The harness itself is not built yet; this package reserves its namespace.
"""

__all__: list[str] = []
