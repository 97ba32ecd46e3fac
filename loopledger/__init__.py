"""loopledger: a durable agent loop as a persisted state machine.

The parts live in sub-packages: ``loopledger.engine`` (the durable loop and
its journal), ``loopledger.validators`` (pure, versioned checks),
``loopledger.replay`` (offline re-evaluation), ``loopledger.ui`` (the
workbench) and ``loopledger.datasets`` (scenarios and importers).
``loopledger.canonical`` is the one serialisation every part agrees on.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
