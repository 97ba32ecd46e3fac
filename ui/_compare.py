"""The data behind the Compare validators and Labels pages.

A *suite side* is either ``recorded`` (the decisions the engine made, the
``validations`` table) or a replay (``replays/<id>/decisions``). Two sides
are compared decision by decision, keyed by (run_id, step, attempt,
candidate_id, validator). When the second side is a replay whose baseline
is the first, the replay's own ``diffs`` table already holds every changed
decision and is used instead of joining millions of decisions again; the
two paths give the same answer (tests/ui/test_queries.py checks it). Its
rows with an empty validator (a candidate's overall verdict) are not
decisions of a validator and are left out of the decision counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._data import RECORDED, VERDICTS, CorruptData, NoData, Traces
from ._queries import recorded_suites

_KEY = "run_id, step, attempt, candidate_id, validator"
DIVERGENCE_ROWS = 2000  # runs listed on the page; the total is always shown
_NONE = "(none)"  # a decision one side made and the other did not
#: A flip whose two decisions are by different versions of the validator.
_ACROSS = "xa IS NOT NULL AND xb IS NOT NULL AND xa <> xb"


def sides(t: Traces) -> list[str]:
    """What can be compared: the recorded decisions and every readable
    replay that wrote decisions (an unreadable one is named apart)."""
    found = [RECORDED] if t.has("validations") else []
    return found + t.readable_replay_ids()


def replay_summaries(t: Traces) -> Any:
    return t.df("SELECT * EXCLUDE (replay_dir), replay_dir FROM replay_summary ORDER BY replay_dir")


def unreadable_replays(t: Traces) -> dict[str, str]:
    """Replays whose files cannot be read (left out of every view), and why."""
    t.con  # noqa: B018 - opening the connection finds them
    return dict(t.unreadable_replays)


def _source(t: Traces, side: str, name: str) -> tuple[str, dict[str, Any]]:
    if side == RECORDED:
        t.require("validations")
        return f"SELECT {_KEY}, verdict, code, validator_version FROM validations", {}
    if side not in t.replay_ids():
        raise NoData(f"No replay `{side}` with decisions under {t.replays_dir}.")
    t.require_replay(side)
    return (f"SELECT {_KEY}, verdict, code, validator_version FROM replay_decisions WHERE replay_dir = ${name}",
            {name: side})


def _diffs_apply(t: Traces, a: str, b: str) -> bool:
    """Whether ``b``'s diffs table was computed against ``a``."""
    if a == b or b == RECORDED or not t.replay_has(b, "diffs") or not t.replay_has(b, "summary"):
        return False
    rows = t.rows("SELECT baseline FROM replay_summary WHERE replay_dir = $b", {"b": b})
    return bool(rows) and rows[0][0] == a


def compare_validators(t: Traces, a: str, b: str) -> dict[str, Any]:
    """Side ``a`` (the baseline) against side ``b``: totals, flips by validator
    and code, the verdict confusion matrix, label regressions and fixes, and
    each diverged run's divergence point (its first step with a flip)."""
    src_a, pa = _source(t, a, "a")
    src_b, pb = _source(t, b, "b")
    params = {**pa, **pb}
    cur = t.cursor()
    compared = _flips_from_diffs(t, b, (src_a, pa), (src_b, pb), cur) if _diffs_apply(t, a, b) else None
    fast = compared is not None
    if compared is None:
        compared = _flips_from_join(t, a, b, src_a, src_b, params, cur)
    decisions, confusion, not_compared = compared
    # A flip between two versions of one validator is the validator's own
    # change, not the runs' (docs/replay.md): counted and shown apart.
    across = f"({_ACROSS})"
    (flips, verdict_flips, runs_diverged, candidates, flips_across) = t.one(
        "SELECT count(*), count(*) FILTER (va IS DISTINCT FROM vb), count(DISTINCT run_id), "
        f"count(DISTINCT (run_id, step, attempt, candidate_id)), count(*) FILTER {across} FROM flips", None, cur)
    by_validator = t.df(
        f"""SELECT validator, coalesce(xa, '') AS baseline_version, coalesce(xb, '') AS replay_version,
                   coalesce({across}, false) AS across_versions,
                   coalesce(va, '{_NONE}') AS baseline_verdict, coalesce(vb, '{_NONE}') AS replay_verdict,
                   coalesce(ca, '') AS baseline_code, coalesce(cb, '') AS replay_code, count(*) AS flips,
                   count(DISTINCT run_id) AS runs
            FROM flips GROUP BY ALL ORDER BY flips DESC, validator, baseline_version, replay_version""",
        None, cur,
    )
    divergence = t.df(
        f"""WITH d AS (SELECT run_id, min(step) AS divergence_step, count(*) AS flips,
                              count(*) FILTER {across} AS flips_across_versions FROM flips GROUP BY run_id)
            SELECT d.run_id, r.task_id, r.prompt_version, r.status, r.reason, d.divergence_step, d.flips,
                   d.flips_across_versions
            FROM d LEFT JOIN runs r ON r.run_id = d.run_id
            ORDER BY d.flips DESC, d.run_id LIMIT {DIVERGENCE_ROWS}""",
        None, cur,
    )
    by_step = t.df("WITH d AS (SELECT run_id, min(step) AS divergence_step FROM flips GROUP BY run_id) "
                   "SELECT divergence_step, count(*) AS runs FROM d GROUP BY ALL ORDER BY 1", None, cur)
    try:
        labelled = _label_outcomes(t, cur, src_a, src_b, params, (a != RECORDED, b != RECORDED))
        labels_error = None
    except CorruptData as exc:
        # The flips, the matrix and the divergence need no labels: only the
        # figures against labels are lost (and say why).
        labelled, labels_error = None, str(exc)
    cur.close()
    return {
        "a": a, "b": b, "used_diffs": fast,
        "totals": {"decisions": int(decisions), "flips": int(flips), "verdict_flips": int(verdict_flips),
                   "runs_diverged": int(runs_diverged), "candidates_changed": int(candidates),
                   "flips_across_versions": int(flips_across),
                   "not_compared": int(not_compared),
                   "regressions": None if labelled is None else int((labelled["outcome"] == "regression").sum()),
                   "fixes": None if labelled is None else int((labelled["outcome"] == "fix").sum())},
        "by_validator": by_validator,
        "confusion": _square(confusion),
        "labels": labelled,
        "labels_error": labels_error,
        # The recorded side's suite versions: several when runs were recorded
        # under different suites (a replay's side has one).
        "recorded_suites": recorded_suites(t) if RECORDED in (a, b) else [],
        "divergence": divergence,
        "divergence_by_step": by_step,
    }


def _flips_from_diffs(t: Traces, b: str, side_a: tuple[str, dict[str, Any]],
                      side_b: tuple[str, dict[str, Any]], cur: Any) -> tuple[int, Any, int] | None:
    """Side ``b`` is a replay against side ``a``: its ``diffs`` are the flips, and
    the verdict matrix follows from them and each side's counts. Leaves the
    temporary table ``flips`` and returns (decisions, confusion, candidates
    not compared), or None when the diffs cannot place every decision (the
    full join must then)."""
    src_a, pa = side_a
    src_b, pb = side_b
    t.rows(
        f"""CREATE TEMP TABLE flips AS
            SELECT {_KEY}, baseline_verdict AS va, replay_verdict AS vb, baseline_code AS ca,
                   replay_code AS cb, baseline_validator_version AS xa, replay_validator_version AS xb
            FROM replay_diffs WHERE replay_dir = $b AND validator <> ''""",
        {"b": b}, cur,
    )
    # Each side's decisions by validator and verdict: one scan each.
    counts_b = _counts(t.rows(f"SELECT validator, verdict, count(*) FROM ({src_b}) GROUP BY ALL", pb, cur))
    decisions = sum(counts_b.values())
    # B's diffs cover the runs B replayed; A's decisions on runs B never
    # saw (recorded after it) are not compared. Cheap when B replayed
    # every run, the usual case: its summary says how many it did.
    counts_a = _counts(t.rows(f"SELECT validator, verdict, count(*) FROM ({src_a}) GROUP BY ALL", pa, cur))
    summary = _summary_counts(t, b, ("runs", "not_in_baseline"))
    unseen = 0
    if summary["runs"] < int(t.one("SELECT count(*) FROM runs", None, cur)[0]):
        # The few runs B never replayed, then A's decisions on them alone
        # (a small hash table probed by one scan), taken out of A's counts.
        t.rows(f"CREATE TEMP TABLE unseen_runs AS SELECT run_id FROM runs "
               f"ANTI JOIN (SELECT DISTINCT run_id FROM ({src_b})) USING (run_id)", pb, cur)
        t.rows(f"CREATE TEMP TABLE unseen AS SELECT x.* FROM ({src_a}) x SEMI JOIN unseen_runs USING (run_id)",
               pa, cur)
        for key, n in _counts(t.rows("SELECT validator, verdict, count(*) FROM unseen GROUP BY ALL",
                                     None, cur)).items():
            counts_a[key] -= n
        (unseen,) = t.one("SELECT count(*) FROM (SELECT DISTINCT run_id, step, attempt, candidate_id "
                          "FROM unseen)", None, cur)
    if summary["not_in_baseline"] or not _aligned(counts_a, counts_b):
        # A validator both sides ran that did not decide on the same
        # candidates on both (runs recorded under different suites, or
        # candidates one side never saw): the diffs cannot place every
        # decision in the verdict matrix. The full join can.
        for name in ("flips", "unseen", "unseen_runs"):
            t.rows(f"DROP TABLE IF EXISTS {name}", None, cur)
        return None
    return decisions, _confusion_from_flips(t, cur, counts_a, counts_b), unseen


def _flips_from_join(t: Traces, a: str, b: str, src_a: str, src_b: str, params: dict[str, Any],
                     cur: Any) -> tuple[int, Any, int]:
    """Both sides' decisions joined: leaves the temporary table ``flips`` and
    returns (decisions, confusion, candidates not compared)."""
    # One pass over both sides: the verdict pairs of every decision, and
    # the flipped decisions kept aside for the breakdowns.
    t.rows(
        f"""CREATE TEMP TABLE joined AS
            SELECT {_KEY}, a.verdict AS va, b.verdict AS vb, a.code AS ca, b.code AS cb,
                   a.validator_version AS xa, b.validator_version AS xb
            FROM ({src_a}) a FULL OUTER JOIN ({src_b}) b USING ({_KEY})""",
        params, cur,
    )
    # As a replay against an earlier one (docs/replay.md): a candidate a
    # replay side made no decision on at all (its run was recorded after
    # that replay, or outside its traces) is not compared. The recorded
    # side compares every candidate, as a replay against it does.
    missing = [f"count({v}) = 0" for v, side in (("va", a), ("vb", b)) if side != RECORDED]
    if missing:
        t.rows("CREATE TEMP TABLE one_sided AS SELECT run_id, step, attempt, candidate_id FROM joined "
               f"GROUP BY ALL HAVING {' OR '.join(missing)}", None, cur)
        (not_compared,) = t.one("SELECT count(*) FROM one_sided", None, cur)
        t.rows("DELETE FROM joined WHERE EXISTS (SELECT 1 FROM one_sided o WHERE o.run_id = joined.run_id "
               "AND o.step = joined.step AND o.attempt = joined.attempt "
               "AND o.candidate_id = joined.candidate_id)", None, cur)
    else:
        not_compared = 0
    # As a replay's diffs: a decision one side makes and the other does
    # not is a flip only where it objects (docs/replay.md), so swapping
    # the sides mirrors the flips.
    t.rows("CREATE TEMP TABLE flips AS SELECT * FROM joined "
           "WHERE (va IS DISTINCT FROM vb OR ca IS DISTINCT FROM cb) "
           "AND NOT (va IS NULL AND vb = 'accept') AND NOT (vb IS NULL AND va = 'accept')", None, cur)
    (decisions,) = t.one("SELECT count(*) FILTER (vb IS NOT NULL) FROM joined", None, cur)
    # Every compared decision, on either side or both.
    confusion = t.df(f"SELECT coalesce(va, '{_NONE}') AS baseline, coalesce(vb, '{_NONE}') AS replay, "
                     "count(*) AS decisions FROM joined GROUP BY ALL", None, cur)
    return decisions, confusion, not_compared


def _summary_counts(t: Traces, replay: str, columns: Sequence[str]) -> dict[str, int]:
    """Counts from a replay's summary row, read once; 0 for a column a
    replay written before it existed lacks (selecting it by name would fail,
    and a failing query makes the page check every file)."""
    summary = t.df("SELECT * FROM replay_summary WHERE replay_dir = $r", {"r": replay})
    counts = {}
    for column in columns:
        value = summary[column].iloc[0] if column in summary.columns and not summary.empty else None
        counts[column] = 0 if value is None or value != value else int(value)  # NaN: a row without it
    return counts


def _counts(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[str, str], int]:
    return {(validator, verdict): int(n) for validator, verdict, n in rows}


def _aligned(counts_a: dict[tuple[str, str], int], counts_b: dict[tuple[str, str], int]) -> bool:
    """Whether every validator both sides ran made as many decisions on each
    (so, on the same candidates: a replay decides on every candidate of the
    runs it replays, with every member)."""
    totals: list[dict[str, int]] = [{}, {}]
    for side, counts in zip(totals, (counts_a, counts_b)):
        for (validator, _), n in counts.items():
            side[validator] = side.get(validator, 0) + n
    return all(totals[1][v] == n for v, n in totals[0].items() if v in totals[1])


def _confusion_from_flips(t: Traces, cur: Any, counts_a: dict[tuple[str, str], int],
                          counts_b: dict[tuple[str, str], int]) -> Any:
    """The confusion matrix from each side's (validator, verdict) counts and
    B's diffs, without joining the decisions: a validator both sides ran
    decided on every candidate on both, so its decisions not in the diffs
    kept their verdict; a validator one side ran (a member added or removed)
    is all ``(none)`` on the other side, whatever the diffs (which list such
    a decision only where it objects) say."""
    import pandas as pd

    on_a, on_b = {v for v, _ in counts_a}, {v for v, _ in counts_b}
    moved = t.df(f"SELECT validator, coalesce(va, '{_NONE}') AS baseline, coalesce(vb, '{_NONE}') AS replay, "
                 "count(*) AS decisions FROM flips WHERE va IS DISTINCT FROM vb GROUP BY ALL", None, cur)
    moved = moved[moved["validator"].isin(on_a & on_b)]
    rows: list[tuple[str, str, int]] = []
    left = {key: n for key, n in counts_a.items() if key[0] in on_b}
    for row in moved.itertuples():
        if (row.validator, row.baseline) in left:
            left[(row.validator, row.baseline)] -= int(row.decisions)
        rows.append((row.baseline, row.replay, int(row.decisions)))
    rows += [(verdict, verdict, n) for (_, verdict), n in left.items()]
    rows += [(verdict, _NONE, n) for (v, verdict), n in counts_a.items() if v not in on_b]
    rows += [(_NONE, verdict, n) for (v, verdict), n in counts_b.items() if v not in on_a]
    return pd.DataFrame(rows, columns=["baseline", "replay", "decisions"])


def _square(confusion: Any) -> Any:
    """Long (baseline, replay, decisions) → a verdict × verdict table, rows
    the baseline; verdicts in severity order, then any others."""
    seen = set(confusion["baseline"]) | set(confusion["replay"])
    order = [v for v in VERDICTS if v in seen or v in VERDICTS] + sorted(seen - set(VERDICTS))
    table = confusion.pivot_table(index="baseline", columns="replay", values="decisions", aggfunc="sum",
                                  fill_value=0)
    return table.reindex(index=order, columns=order, fill_value=0).astype(int)


def _label_outcomes(t: Traces, cur: Any, src_a: str, src_b: str, params: dict[str, Any],
                    uncompared: tuple[bool, bool] = (False, False)) -> Any:
    """Each labelled decision with both sides' verdicts and whether ``b``
    is a regression (the label agreed with ``a``, not with ``b``), a fix
    (the reverse), or neither. A label with an empty validator judges the
    candidate as a whole, whose verdict is its worst validator's. Both
    sides are narrowed to the labelled candidates first, by a semi join
    (a tuple ``IN`` was several times slower on millions of decisions).
    ``uncompared``: for side a, side b, whether a candidate that side made
    no decision on is not compared (a replay's side, see compare_validators):
    a label on it is then ``not compared``, whichever side is A."""
    severity = "CASE verdict " + " ".join(f"WHEN '{v}' THEN {i}" for i, v in enumerate(VERDICTS)) + " END"
    worst = "CASE max_s " + " ".join(f"WHEN {i} THEN '{v}'" for i, v in enumerate(VERDICTS)) + " END"
    cand = "run_id, step, attempt, candidate_id"
    return t.df(
        f"""
        WITH l AS (SELECT * FROM effective_labels),
        lc AS (SELECT DISTINCT {cand} FROM l),
        a AS (SELECT x.* FROM ({src_a}) x SEMI JOIN lc USING ({cand})),
        b AS (SELECT x.* FROM ({src_b}) x SEMI JOIN lc USING ({cand})),
        wa AS (SELECT {cand}, '' AS validator, {worst} AS verdict
               FROM (SELECT {cand}, max({severity}) AS max_s FROM a GROUP BY ALL)),
        wb AS (SELECT {cand}, '' AS validator, {worst} AS verdict
               FROM (SELECT {cand}, max({severity}) AS max_s FROM b GROUP BY ALL)),
        va AS (SELECT {_KEY}, verdict FROM a UNION ALL SELECT * FROM wa),
        vb AS (SELECT {_KEY}, verdict FROM b UNION ALL SELECT * FROM wb)
        SELECT run_id, step, attempt, candidate_id, validator, expected_verdict, source,
               baseline_verdict, replay_verdict,
               CASE WHEN ({str(uncompared[0]).lower()} AND decided_a IS NULL)
                      OR ({str(uncompared[1]).lower()} AND decided_b IS NULL)
                    -- A candidate a replay side made no decision on.
                    THEN 'not compared'
                    WHEN ea IS NULL OR eb IS NULL OR ea = eb
                    -- As the replay compares: a candidate one side did not
                    -- decide has no verdict to flip, and equal verdicts are
                    -- no flip (either way: swapping the sides mirrors
                    -- regressions and fixes).
                    THEN CASE WHEN expected_verdict = eb THEN 'agrees' ELSE 'disagrees' END
                    WHEN expected_verdict = ea THEN 'regression'
                    WHEN expected_verdict = eb THEN 'fix'
                    ELSE 'disagrees' END AS outcome
        FROM (
        SELECT l.run_id, l.step, l.attempt, l.candidate_id, l.validator, l.expected_verdict, l.source,
               va.verdict AS baseline_verdict, vb.verdict AS replay_verdict,
               wa_c.verdict AS decided_a, wb_c.verdict AS decided_b,
               -- A validator one side does not run did not object there: it
               -- reads as accept, as in the replay's own classification.
               CASE WHEN l.validator <> '' THEN coalesce(va.verdict, 'accept') ELSE va.verdict END AS ea,
               CASE WHEN l.validator <> '' THEN coalesce(vb.verdict, 'accept') ELSE vb.verdict END AS eb
        FROM l
        LEFT JOIN va USING ({_KEY})
        LEFT JOIN vb USING ({_KEY})
        LEFT JOIN wa wa_c USING ({cand})
        LEFT JOIN wb wb_c USING ({cand})
        )
        ORDER BY outcome, run_id, step, attempt, validator
        """,
        params, cur,
    )


# -- Labels ---------------------------------------------------------------------------


def labels_summary(t: Traces) -> Any:
    """Labels of every source (scenario labels derived as a replay does) by source and verdict."""
    t.require("runs")
    return t.df("SELECT source, expected_verdict, count(*) AS labels FROM all_labels GROUP BY ALL ORDER BY ALL")


def labels_count(t: Traces, source: str | None = None) -> int:
    t.require("runs")
    where = "WHERE source = $source" if source else ""
    (total,) = t.one(f"SELECT count(*) FROM all_labels {where}", {"source": source} if source else {})
    return int(total)


def labels_page(t: Traces, source: str | None = None, offset: int = 0, limit: int = 50) -> tuple[int, Any]:
    total = labels_count(t, source)
    where = "WHERE source = $source" if source else ""
    params: dict[str, Any] = {"source": source} if source else {}
    page = t.df(
        f"""SELECT created_at, run_id, step, attempt, candidate_id, validator, expected_verdict, source, note
            FROM all_labels {where}
            ORDER BY created_at DESC NULLS LAST, label_id DESC NULLS LAST, run_id, step, attempt, validator LIMIT $limit OFFSET $offset""",
        {**params, "limit": int(limit), "offset": int(offset)},
    )
    return int(total), page


def labels_csv(t: Traces) -> str:
    """Every label as CSV, for the export button."""
    t.require("runs")
    frame = t.df("SELECT run_id, step, attempt, candidate_id, validator, expected_verdict, source, note, "
                 "created_at FROM all_labels ORDER BY created_at NULLS FIRST, label_id, run_id, step, attempt, "
                 "validator")
    return frame.to_csv(index=False)
