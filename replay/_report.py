"""Reports of a replay: the terminal summary (rich), Markdown and JUnit XML.

All three say the same things: the counts; the flips grouped by validator
and by what changed; the runs that diverged and where, with the reminder
that past a divergence point the recorded path is not what the new suite
would have produced; and, apart, the flips that compare two versions of one
validator (a version change, not a trend in the data).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from loopledger._text import visible

from ._result import Diff, ReplayResult, RunReplay

#: Rows of the longer lists shown in the terminal and Markdown reports.
SHOWN = 15

DIVERGENCE_NOTE = ("Past a run's divergence point the recorded path is no longer what the replayed suite would "
                   "have produced; later decisions are judged on the recorded path, not on a counterfactual one.")


#: What XML 1.0 cannot hold, even escaped (control characters, lone surrogates).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    """``text`` with every character XML cannot hold written as ``\\xNN``."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _side(verdict: str | None, code: str | None) -> str:
    """One side of a diff; a decision one side never made shows as a dash."""
    return "—" if verdict is None else f"{verdict}/{code}"


def _versions(d: Diff) -> str:
    """``1→2`` for a flip across validator versions, else empty."""
    return f"{d.baseline_validator_version}→{d.replay_validator_version}" if d.across_versions else ""


def _version_change(versions: str) -> str:
    """How every report shows a flip across validator versions."""
    return f"(versions {versions})"


def _candidates_note(result: ReplayResult, field: str, said: str) -> str:
    """``said`` of the candidates a ``field`` of the summary counts, with
    how many runs hold them (empty: none)."""
    count = getattr(result.summary, field)
    if not count:
        return ""
    runs = sum(1 for r in result.runs.values() if getattr(r, field))
    return f"{count:,} candidate(s) in {runs:,} run(s) {said}"


def _not_compared(result: ReplayResult) -> str:
    """What the baseline replay did not decide on, in words (empty: nothing)."""
    return _candidates_note(result, "not_in_baseline", f"have no decision in baseline {result.summary.baseline} "
                            "(runs recorded since, outside its traces, or that it could not replay): not compared, "
                            "never a flip.")


def _not_recorded(result: ReplayResult) -> str:
    """Candidates with no recorded decision to compare with, in words (empty: none)."""
    return _candidates_note(result, "not_recorded", "have no recorded decisions (imported without --decide): each "
                            "decision that objects is a change unless a person labelled that validator's decision, "
                            "and labels on a candidate as a whole (an import's reward) classify nothing. Record a "
                            "baseline by importing the source with `--decide SUITE` into a home that does not hold "
                            "these runs yet (runs already imported are skipped), or compare with an earlier replay "
                            "(--baseline REPLAY_ID).")


def _mixed_baseline(result: ReplayResult) -> str:
    """Recorded decisions made under several suites, in words (empty: one or none)."""
    if result.summary.baseline_suites < 2:
        return ""
    versions = sorted({visible(v) for r in result.runs.values() for v in r.baseline_suites})
    return (f"The recorded decisions were made under {len(versions)} suite versions ({', '.join(versions)}): "
            "runs recorded under different suites are compared alike, and a flip on a run recorded under "
            "another suite can be that suite's difference, not the run's.")


def _counts(result: ReplayResult) -> list[tuple[str, str]]:
    s = result.summary
    rate = f"{s.candidates_rerun / s.seconds:,.0f}" if s.seconds else "-"
    # Against the recorded decisions every candidate is compared.
    not_compared = [] if s.baseline == "recorded" else [("candidates not compared (not in the baseline replay)",
                                                          f"{s.not_in_baseline:,}")]
    diffs = f"of these {s.flips + s.candidate_flips:,} diffs:"  # each flip is a diffs row; a label classifies either
    return [
        ("runs", f"{s.runs:,}"),
        ("candidates recorded", f"{s.candidates:,}"),
        ("candidates re-run (those that reached validation)", f"{s.candidates_rerun:,}"),
        ("decisions", f"{s.decisions:,}"),
        ("flips (validator decisions)", f"{s.flips:,}"),
        ("candidates whose verdict flipped", f"{s.candidate_flips:,}"),
        (f"{diffs} regressions", f"{s.regressions:,}"),
        (f"{diffs} fixes", f"{s.fixes:,}"),
        (f"{diffs} changes (no label tells the sides apart)", f"{s.changes:,}"),
        ("flips across validator versions", f"{s.flips_across_versions:,}"),
        ("runs diverged", f"{s.runs_diverged:,}"),
        *not_compared,
        ("recorded runs that did not succeed (data)", f"{s.runs_failed:,}"),
        ("runs whose trace could not be replayed", f"{s.run_errors:,}"),
        ("labelled decisions the replay agrees with", f"{s.labels_agreeing:,} of {s.labels:,}"),
        ("loop diagnoses (batch detectors)", f"{s.diagnoses:,}"),
        ("seconds", f"{s.seconds:.2f} ({rate} candidates re-run/s)"),
    ]


def flip_groups(diffs: Sequence[Diff]) -> list[tuple[tuple[str, str, str, str, str], Counter[str]]]:
    """Validator flips grouped by (validator, baseline verdict/code, replay
    verdict/code), most frequent first, each with its kinds counted."""
    groups: dict[tuple[str, str, str, str, str], Counter[str]] = {}
    for d in diffs:
        if d.candidate_level:
            continue
        key = (d.validator, _side(d.baseline_verdict, d.baseline_code), _side(d.replay_verdict, d.replay_code),
               _versions(d), "")
        groups.setdefault(key, Counter())[d.kind] += 1
    return sorted(groups.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))


def _kinds(c: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items()))


def _title(result: ReplayResult) -> str:
    s = result.summary
    return f"Replay {s.replay_id}: suite {s.suite_name} ({s.suite_version}) against baseline {s.baseline}"


def gate(result: ReplayResult, fail_on: str, rich: bool = False, name_option: bool = True) -> str:
    """The gate's verdict in words: pass, fail with the failures' count, or
    incomplete when some runs could not be replayed (the command then exits
    2 whatever the comparison of the others says)."""
    if result.errors:
        text = f"incomplete, {len(result.errors)} run(s) not replayed"
        return f"[red]{text}[/]" if rich else text
    failures = result.failures(fail_on)
    if not failures:
        text = "pass (report only)" if fail_on == "never" else "pass"
        return f"[green]{text}[/]" if rich else text
    text = f"fail, {len(failures)} failure(s)" + (f" under --fail-on {fail_on}" if name_option else "")
    return f"[red]{text}[/]" if rich else text


def print_summary(result: ReplayResult, fail_on: str, console: Any = None) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from loopledger._console import console as stdout_console
    from loopledger._text import plain_cells as row

    # Run ids must stay whole: in a CI log (not a terminal) rich would cut
    # every table to 80 columns.
    console = console or stdout_console()
    table = Table(title=escape(_title(result)), show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, value in _counts(result):
        table.add_row(*row(name, value))
    console.print(table)
    groups = flip_groups(result.diffs)
    if groups:
        flips = Table(title="Flips by validator")
        for name in ("validator", "baseline", "replay", "kinds", "count"):
            flips.add_column(name, justify="right" if name == "count" else "left")
        for (validator, old, new, versions, _), kinds in groups[:SHOWN]:
            named = Text(visible(validator))
            if versions:
                named.append(f" {_version_change(versions)}", style="yellow")
            flips.add_row(*row(named, old, new, _kinds(kinds), sum(kinds.values())))
        console.print(flips)
    diverged = result.diverged
    if diverged:
        runs = Table(title=f"Runs diverged ({len(diverged)})")
        for name in ("run", "recorded outcome", "divergence point", "validators", "regressions"):
            runs.add_column(name)
        for r in diverged[:SHOWN]:
            d = r.divergence
            assert d is not None
            runs.add_row(*row(r.run_id, f"{r.status} {r.reason or ''}".strip(), f"step {d.step} attempt {d.attempt}",
                              ", ".join(d.validators), len(r.regressions)))
        console.print(runs)
        if len(diverged) > SHOWN:
            console.print(f"... and {len(diverged) - SHOWN} more (replays/{result.replay_id}/diffs).")
        console.print(DIVERGENCE_NOTE)
    for note in (_not_compared(result), _not_recorded(result), _mixed_baseline(result)):
        if note:
            console.print(escape(note))
    if result.summary.flips_across_versions:
        console.print(f"[yellow]{result.summary.flips_across_versions} flip(s) compare different versions of a "
                      "validator: they say what the new version decides, and are kept out of trend figures.[/]")
    for r in result.errors[:SHOWN]:
        console.print(f"[red]not replayed:[/] {escape(visible(r.run_id))}: {escape(visible(r.error or ''))}")
    console.print(f"Gate: {gate(result, fail_on, rich=True)}")
    if result.path is not None:
        console.print(f"Tables: {escape(str(result.path))}")


def _cell(text: object) -> str:
    """Text for a Markdown table cell: one line, its pipes escaped (GFM
    ends a cell at a bare ``|``, even inside a code span), its control
    characters written out (a terminal would act on an escape sequence
    shown from a CI summary, and some tools take a NUL for a binary file)."""
    return visible(" ".join(str(text).split())).replace("|", "\\|")


def _code(text: object) -> str:
    """A code span in a table cell, whatever backticks the text holds: a
    fence one backtick longer than the longest run inside it."""
    body = _cell(text)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def markdown(result: ReplayResult, fail_on: str) -> str:
    lines = [f"# {_title(result)}", ""]
    lines += [f"**Gate (`--fail-on {fail_on}`): {gate(result, fail_on, name_option=False)}**",
              "", "| | |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in _counts(result)]
    groups = flip_groups(result.diffs)
    if groups:
        lines += ["", "## Flips by validator", "", "| validator | baseline | replay | kinds | count |",
                  "|---|---|---|---|---:|"]
        for (validator, old, new, versions, _), kinds in groups:
            tag = f" {_cell(_version_change(versions))}" if versions else ""
            lines.append(f"| {_code(validator)}{tag} | {_cell(old)} | {_cell(new)} | {_kinds(kinds)} | "
                         f"{sum(kinds.values())} |")
    for kind, title in (("regression", "Regressions"), ("fix", "Fixes")):
        lines += _labelled_diffs([d for d in result.diffs if d.kind == kind], title, result)
    diverged = result.diverged
    if diverged:
        lines += ["", f"## Runs diverged ({len(diverged)})", "", DIVERGENCE_NOTE, "",
                  "| run | recorded outcome | divergence point | validators | regressions |", "|---|---|---|---|---:|"]
        for r in diverged[:LISTED]:
            d = r.divergence
            assert d is not None
            lines.append(f"| {_code(r.run_id)} | {_cell(r.status)} {_cell(r.reason or '')} | "
                         f"step {d.step}, attempt {d.attempt} | {_cell(', '.join(d.validators))} | "
                         f"{len(r.regressions)} |")
        lines += _more(len(diverged), result)
    for note in (_not_compared(result), _not_recorded(result), _mixed_baseline(result)):
        if note:
            lines += ["", f"> {_cell(note)}"]
    if result.summary.flips_across_versions:
        lines += ["", f"> {result.summary.flips_across_versions} flip(s) compare different versions of one "
                  "validator; they are shown as such and kept out of trend figures."]
    if result.errors:
        lines += ["", "## Runs not replayed", ""] + [f"- {_code(r.run_id)}: {_cell(r.error)}" for r in result.errors]
    return "\n".join(lines) + "\n"


#: Rows a Markdown section lists; the tables hold them all.
LISTED = 100


def _more(total: int, result: ReplayResult) -> list[str]:
    """The line after a section cut at :data:`LISTED` rows, saying where the rest are."""
    if total <= LISTED:
        return []
    where = str(result.path / "diffs") if result.path is not None else "the result's diffs"
    return ["", f"… and {total - LISTED} more ({where})."]


def _labelled_diffs(diffs: Sequence[Diff], title: str, result: ReplayResult) -> list[str]:
    """A section listing diffs a label classified (the first :data:`LISTED`)."""
    if not diffs:
        return []
    lines = ["", f"## {title} ({len(diffs)})", "",
             "| run | step | attempt | validator | label | baseline | replay | past the divergence point |",
             "|---|---:|---:|---|---|---|---|---|"]
    for d in diffs[:LISTED]:
        lines.append(f"| {_code(d.run_id)} | {d.step} | {d.attempt} | {_code(d.validator or '(candidate)')} | "
                     f"{_cell(d.expected_verdict)} ({_cell(d.label_source)}) | "
                     f"{_cell(_side(d.baseline_verdict, d.baseline_code))} | "
                     f"{_cell(_side(d.replay_verdict, d.replay_code))} | {'yes' if d.after_divergence else ''} |")
    return lines + _more(len(diffs), result)


def _failure_text(diffs: Sequence[Diff]) -> str:
    return "\n".join(
        f"step {d.step} attempt {d.attempt} {d.validator or '(candidate)'}"
        + (f" {_version_change(_versions(d))}" if d.across_versions else "")
        + f": {_side(d.baseline_verdict, d.baseline_code)} -> {_side(d.replay_verdict, d.replay_code)} ({d.kind}"
        + (f", label {d.expected_verdict} from {d.label_source}" if d.expected_verdict else "")
        + (", past the divergence point: judged on a path the suite would not have produced"
           if d.after_divergence else "") + ")"
        for d in diffs)


def _failure_message(run: RunReplay, failing: Sequence[Diff], suite: str) -> str:
    """The run's divergence point, and the failing flips that compare two
    versions of one validator, which say what the new version decides."""
    assert run.divergence is not None
    message = run.divergence.describe(suite)
    across = sum(1 for d in failing if d.across_versions)
    if across:
        message += (f"; {across} of these flip(s) compare different versions of a validator (a version change, "
                    "not a change in the data)")
    return message


def junit(result: ReplayResult, fail_on: str) -> str:
    """One test case per run (class: the task), failing when the run has a
    diff that fails the gate, in error when its trace could not be replayed,
    skipped when the baseline replay decided on none of its candidates."""
    failing = {id(d) for d in result.failures(fail_on)}
    runs: list[RunReplay] = list(result.runs.values())
    baseline = result.summary.baseline
    # The suite by name and version: two files may share a name.
    suite_named = f"{result.summary.suite_name} ({result.summary.suite_version})"
    suite = ET.Element("testsuite", {
        "name": f"loopledger replay {result.summary.suite_name}",
        "tests": str(len(runs)),
        "failures": str(sum(1 for r in runs if any(id(d) in failing for d in r.diffs))),
        "errors": str(sum(1 for r in runs if r.error is not None)),
        "skipped": str(sum(1 for r in runs if r.not_compared)),
        "time": f"{result.summary.seconds:.3f}",
    })
    props = ET.SubElement(suite, "properties")
    for name in ("replay_id", "suite_version", "baseline", "not_in_baseline", "not_recorded", "baseline_suites"):
        ET.SubElement(props, "property", {"name": name, "value": str(getattr(result.summary, name))})
    for r in runs:
        case = ET.SubElement(suite, "testcase", {"classname": r.task_id or "run", "name": r.run_id})
        if r.error is not None:
            ET.SubElement(case, "error", {"message": r.error})
            continue
        not_compared = f"{r.not_in_baseline} candidate(s) not compared: baseline {baseline} made no decision on them"
        if r.not_compared:
            ET.SubElement(case, "skipped", {"message": not_compared})
            continue
        mine = [d for d in r.diffs if id(d) in failing]
        if mine:
            failure = ET.SubElement(case, "failure", {"message": _failure_message(r, mine, suite_named)})
            failure.text = _failure_text(mine)
        # Every other diff of the run too: a failing case shows no less than a passing one.
        others = [d for d in r.diffs if id(d) not in failing]
        notes = [("other diffs:\n" if mine else "") + _failure_text(others)] if others else []
        if r.not_in_baseline:
            notes.append(not_compared)
        if r.not_recorded:
            notes.append(f"{r.not_recorded} candidate(s) have no recorded decisions (imported without --decide): "
                         "compared with nothing")
        if notes:
            ET.SubElement(case, "system-out").text = "\n".join(notes)
    # Task ids and error texts come from the traces, which may hold anything.
    for element in suite.iter():
        element.attrib.update({k: _xml_text(v) for k, v in element.attrib.items()})
        if element.text:
            element.text = _xml_text(element.text)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_reports(result: ReplayResult, fail_on: str, markdown_path: Path | None, junit_path: Path | None) -> None:
    """Write the reports asked for; a failed write (a full disk) names its report."""
    for path, render in ((markdown_path, markdown), (junit_path, junit)):
        if path is None:
            continue
        try:
            path.write_text(render(result, fail_on), encoding="utf-8")
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the report: {exc.strerror or exc}", str(path)) from None
