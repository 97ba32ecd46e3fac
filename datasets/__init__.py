"""Bundled scenarios and suites, and importers of external trace formats.
(The demo tool backends' seed data lives with the backends, in
``loopledger.engine``: see docs/tools.md.)

    from loopledger.datasets import import_traces

    result = import_traces("tau2", ["runs/"], home="loopledger-data")
    result.runs, result.skipped

Formats: ``tau-bench``, ``tau2``, ``openai-jsonl``, ``toolbench`` (each
gzipped too); see docs/importers.md for how each maps onto the trace tables
and what identifies a run.
"""

from ._import_model import ERROR_CODES, Conversation, ImportInputError, Message, ToolCall, ToolResult, error_code
from ._import_run import FORMATS, FileImport, ImportResult, import_traces, read_conversations

__all__ = [
    "ERROR_CODES",
    "FORMATS",
    "Conversation",
    "FileImport",
    "ImportInputError",
    "ImportResult",
    "Message",
    "ToolCall",
    "ToolResult",
    "error_code",
    "import_traces",
    "read_conversations",
]
