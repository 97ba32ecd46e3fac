"""Run the benchmarks: ``python benchmarks/run.py [--quick] [NAME...]``.

Each benchmark is a module ``benchmarks/bench_<name>.py`` run in its own
process (so one benchmark's memory and caches do not colour another's). It
prints what it likes and, as its last line, one JSON object (see
``_common.report``). This runner prints those lines and exits 1 if a
benchmark failed to run; a missed goal is reported in the line (``met``),
not as a failure of the runner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> dict[str, Path]:
    return {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; all in under a minute")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    args = parser.parse_args(argv)
    benches = available()
    unknown = [n for n in args.names if n not in benches]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(benches)}")
    failed = 0
    for name in args.names or list(benches):
        cmd = [sys.executable, str(benches[name])] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            failed += 1
            print(f"# {name} failed (exit {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        for line in lines[:-1]:
            print(f"# {name}: {line}")
        def strict(constant: str) -> None:
            raise ValueError(f"{constant} is not JSON")

        try:
            json.loads(lines[-1], parse_constant=strict)
        except ValueError:
            failed += 1
            print(f"# {name}: last line is not JSON: {lines[-1]}", file=sys.stderr)
            continue
        print(lines[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
