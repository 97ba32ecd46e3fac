"""The ``tests.run`` demo tool's output: a long, deterministic pytest log.

Deterministic so that two runs of a scenario record the same artifact (and
the same artifact id), and long (thousands of lines) so that the engine has
to reduce it before it goes near a model context. The ``fails`` fault turns
a few fixed tests red; nothing else varies.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["SUITES", "test_run_result"]

#: suite -> (test folder, modules, cases per module, lines per test)
SUITES: dict[str, tuple[str, tuple[str, ...], int, int]] = {
    "unit": ("tests/unit", ("test_orders", "test_refunds", "test_addresses", "test_reports"), 600, 1),
    "contract": ("tests/contract", ("test_provider_refunds", "test_provider_orders"), 600, 2),
}

# (module index, case index, error line): the tests the ``fails`` fault breaks.
_FAILING = {
    "unit": ((1, 7, "AssertionError: assert 2499 == 2500"),
             (1, 311, "RefundTooLarge: ORD-1042: 2600 > 2500"),
             (3, 42, "KeyError: 'currency'")),
    "contract": ((0, 99, "AssertionError: provider returned status 'pending', expected 'refunded'"),
                 (1, 5, "ValueError: missing field 'version' in provider response")),
}
_SKIPPED_EVERY = 97  # a few skips, so the summary has three kinds of counts


def _case(module: str, index: int) -> str:
    return f"test_{module.removeprefix('test_')}_{index:04d}"


@lru_cache(maxsize=8)
def _log(suite: str, failing: bool) -> tuple[str, dict[str, Any]]:
    folder, modules, cases, lines_per_test = SUITES[suite]
    broken = {(m, c): err for m, c, err in _FAILING[suite]} if failing else {}
    total = len(modules) * cases
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0",
        "rootdir: /workspace",
        "configfile: pyproject.toml",
        "plugins: hypothesis-6.112.1, timeout-2.3.1",
        f"collected {total} items",
        "",
    ]
    passed = failed = skipped = 0
    done = 0
    failures: list[tuple[str, str, str, int]] = []
    for m, module in enumerate(modules):
        for c in range(cases):
            done += 1
            name = _case(module, c)
            node = f"{folder}/{module}.py::{name}"
            pct = f"[{done * 100 // total:3d}%]"
            if (m, c) in broken:
                status = "FAILED"
                failed += 1
                failures.append((node, name, broken[(m, c)], 10 + c * 7))
            elif done % _SKIPPED_EVERY == 0:
                status = "SKIPPED"
                skipped += 1
            else:
                status = "PASSED"
                passed += 1
            lines.append(f"{node} {status} {pct}")
            if lines_per_test > 1:
                lines.append(f"    interaction {name}: request matched, response verified against schema v3")
    duration = round(total * 0.0173, 2)
    if failures:
        lines.append("")
        lines.append("=================================== FAILURES ===================================")
        for node, name, error, line_no in failures:
            file = node.split("::")[0]
            lines.extend([
                f"_________________________________ {name} _________________________________",
                f"{file}:{line_no}: in {name}",
                "    result = run_case(fixture)",
                f"{file}:{line_no + 3}: in run_case",
                "    check(result)",
                f"E   {error}",
                "",
            ])
        lines.append("=========================== short test summary info ============================")
        for node, _name, error, _ in failures:
            lines.append(f"FAILED {node} - {error}")
    counts = [f"{failed} failed"] if failed else []
    counts += [f"{passed} passed", f"{skipped} skipped"]
    lines.append(f"================= {', '.join(counts)} in {duration}s =================")
    summary = {"passed": passed, "failed": failed, "skipped": skipped, "total": total, "duration_s": duration}
    return "\n".join(lines) + "\n", summary


def test_run_result(suite: str, failing: bool) -> dict[str, Any]:
    """The ``tests.run`` result: counts plus the full log."""
    log, summary = _log(suite, failing)
    return {"suite": suite, **summary, "log": log}


test_run_result.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
