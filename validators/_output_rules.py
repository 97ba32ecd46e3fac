"""``output_rules``: no secrets or personal data in what the model outputs.

Rules are named regular expressions (plus a checksum where one exists, so a
16-digit order number is not a card number). A suite's own (``custom``)
patterns are matched with the ``regex`` module under a timeout, as
``tool_args_schema``'s are: one that backtracks without end cannot hang a
run or a replay; an output it could not check in time is refused
(``output_unchecked``), never let through. The evidence of a match holds
the rule name, the item and field, and character offsets: never the matched
text, because the evidence is stored and shown, and a secret copied into the
decision log is a second leak.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import ParamError
from ._jsonschema import PATTERN_TIMEOUT_S
from ._model import Candidate, ClaimItem, DecisionInput, PlanItem, TextItem, ToolCallItem, Verdict
from ._params import choice_param, int_param, str_list_param
from ._registry import Issue, validator

__all__ = ["RULES", "Rule", "Match", "scan_candidate"]


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(text: str) -> int:
    digits = re.sub(r"[ -]", "", text)
    return len(text) if 13 <= len(digits) <= 19 and _luhn(digits) else 0


def _mod97(iban: str) -> bool:
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _iban(text: str) -> int:
    """The length of the IBAN ``text`` begins with (0: none). Printed IBANs
    come in groups of four, which the pattern lets run on into what follows:
    trailing groups of letters alone (``PAID``) are let go, and so is all
    from a group that may begin the next IBAN (``DE89``), longest first,
    until mod-97 passes. Other groups with a digit are never let go: each
    try is one more chance of a 1-in-97 false match."""
    groups = list(re.finditer(r"[A-Z0-9]+", text))
    ends = []  # where the IBAN may end, longest first
    for i in range(len(groups) - 1, -1, -1):
        ends.append(groups[i].end())
        if i == 0 or not groups[i].group(0).isalpha():
            break
    # Or just before a group that may begin the next one (two IBANs a space apart).
    ends += [groups[i - 1].end() for i in range(len(groups) - 1, 0, -1) if _IBAN_START.fullmatch(groups[i].group(0))]
    for end in sorted(set(ends), reverse=True):
        compact = text[:end].replace(" ", "")
        if 15 <= len(compact) <= 34 and _mod97(compact):
            return end
    return 0


_IBAN_START = re.compile(r"[A-Z]{2}\d{2}")


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    #: ``re`` for the built-in rules, ``regex`` (timed) for a suite's own.
    pattern: Any
    #: Given the matched text, the length of it that is confirmed (0: none).
    confirm: Callable[[str], int] | None = None
    #: Seconds a search may take (a suite's own patterns), None: unbounded.
    timeout: float | None = None


RULES: Mapping[str, Rule] = {
    r.name: r
    for r in (
        Rule(
            "secret_key",
            re.compile(
                r"\b(?:sk|rk)-(?:live-|test-|proj-|ant-)?[A-Za-z0-9_\-]{16,}"
                r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe's secret and restricted keys
                r"|\bwhsec_[A-Za-z0-9]{24,}"  # a webhook signing secret
                r"|\bAKIA[0-9A-Z]{16}\b"
                r"|\bgh[pousr]_[A-Za-z0-9]{36,}\b"
                r"|\bxox[abprs]-[A-Za-z0-9\-]{10,}"
                r"|\bAIza[0-9A-Za-z_\-]{35}"
                r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
            ),
        ),
        Rule(
            "credential",
            re.compile(r"(?i)\b(?:api[_-]?key|secret|passw(?:or)?d|access[_-]?token)\b\s*[:=]\s*[\"']?[^\s\"']{8,}"),
        ),
        Rule("email", re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b")),
        Rule("credit_card", re.compile(r"\b\d(?:[ -]?\d){12,18}\b"), _card),
        # Written whole (GB82WEST12345698765432) or in groups of four
        # (GB82 WEST 1234 5698 7654 32); mod-97 decides.
        Rule("iban", re.compile(r"\b[A-Z]{2}\d{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,4})?)\b"),
             _iban),
    )
}

SCOPES = ("text", "claim", "plan", "tool_arguments")


@dataclass(frozen=True, slots=True)
class Match:
    rule: str
    item: int  # index of the item in the candidate
    field: str  # text, or a JSON path inside the item
    start: int
    end: int

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "item": self.item, "field": self.field, "start": self.start, "end": self.end}


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _strings(value[key], f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def _fields(candidate: Candidate, scopes: tuple[str, ...]) -> Iterator[tuple[int, str, str]]:
    for index, item in enumerate(candidate.items):
        if isinstance(item, TextItem) and "text" in scopes:
            yield index, "text", item.text
        elif isinstance(item, ClaimItem) and "claim" in scopes:
            yield index, "text", item.text
        elif isinstance(item, PlanItem) and "plan" in scopes:
            for path, s in _strings(list(item.steps), "$.steps"):
                yield index, path, s
        elif isinstance(item, ToolCallItem) and "tool_arguments" in scopes:
            if item.arguments is not None:
                for path, s in _strings(item.arguments, "$.arguments"):
                    yield index, path, s
            elif item.raw_arguments:
                yield index, "raw_arguments", item.raw_arguments


#: Seconds one search of a suite's own pattern may take over one field: the
#: bound of every pattern from outside (tool_args_schema's too).
CUSTOM_TIMEOUT_S = PATTERN_TIMEOUT_S


class Unchecked(Exception):
    """A suite's own pattern could not be matched in time."""

    def __init__(self, rule: str, item: int, field: str) -> None:
        super().__init__(rule)
        self.rule, self.item, self.field = rule, item, field


def scan_candidate(candidate: Candidate, rules: tuple[Rule, ...], scopes: tuple[str, ...]) -> list[Match]:
    """Every rule match in the candidate's scanned fields, in item order;
    :class:`Unchecked` when a timed pattern ran out of time."""
    found: list[Match] = []
    for index, field, text in _fields(candidate, scopes):
        for rule in rules:
            if rule.confirm is not None:
                found += [Match(rule.name, index, field, start, end) for start, end in _confirmed(rule, text)]
                continue
            try:
                hits = list(rule.pattern.finditer(text) if rule.timeout is None
                            else rule.pattern.finditer(text, timeout=rule.timeout, concurrent=False))
            except TimeoutError:
                raise Unchecked(rule.name, index, field) from None
            found += [Match(rule.name, index, field, m.start(), m.end()) for m in hits]
    return found


def _confirmed(rule: Rule, text: str) -> Iterator[tuple[int, int]]:
    """A checked rule's matches (built-in, so untimed): each search goes on
    from the end of what was confirmed, so a match that ran on into the
    next one (two IBANs a space apart) does not hide it."""
    pos = 0
    while (m := rule.pattern.search(text, pos)) is not None:
        assert rule.confirm is not None
        length = rule.confirm(m.group(0))
        if length:
            yield m.start(), m.start() + length
            pos = m.start() + length
        else:
            pos = m.end()


def build_rules(patterns: Any, custom: Any) -> tuple[Rule, ...]:
    names = str_list_param("patterns", patterns, RULES)
    rules = [RULES[n] for n in names]
    if not isinstance(custom, Mapping):
        raise ParamError("custom", "a mapping of rule name to regular expression", custom)
    for name in sorted(custom):
        if not isinstance(name, str) or not name.strip():
            # A finding names its rules: a nameless one would name none.
            raise ParamError("custom", "rule names that are not empty", name)
        if not isinstance(custom[name], str):
            raise ParamError(f"custom.{name}", "a regular expression string", custom[name])
        import regex

        try:
            pattern = regex.compile(custom[name])
        except (regex.error, ValueError, OverflowError, RecursionError) as exc:
            raise ParamError(f"custom.{name}", f"a valid regular expression ({exc})", custom[name]) from exc
        if pattern.search("") is not None:
            # It matches empty text, so at every position of every output: all would be flagged.
            raise ParamError(f"custom.{name}", "a regular expression that does not match empty text", custom[name])
        rules.append(Rule(name, pattern, timeout=CUSTOM_TIMEOUT_S))
    return tuple(rules)


def unchecked_issue(exc: Unchecked) -> Issue:
    """An output a suite's own pattern could not check in time: refused."""
    return Issue(
        Verdict.REJECT,
        "output_unchecked",
        f"rule {exc.rule} could not be matched within {CUSTOM_TIMEOUT_S} s on item {exc.item}, {exc.field} (the "
        "pattern backtracks without end on it): the output is not let through unchecked",
        {"rule": exc.rule, "item": exc.item, "field": exc.field, "timeout_s": CUSTOM_TIMEOUT_S},
    )


def sensitive_issue(matches: list[Match], verdict: Verdict, max_matches: int) -> Issue:
    first = matches[0]
    rules = sorted({m.rule for m in matches})
    return Issue(
        verdict,
        "sensitive_output",
        f"output matches {', '.join(rules)} (item {first.item}, {first.field} at {first.start}..{first.end})",
        {"rules": rules, "count": len(matches), "matches": [m.to_json() for m in matches[:max_matches]]},
    )


# 2: Stripe keys and webhook secrets. 3: IBANs printed in groups of four;
# a suite's own patterns bounded in time (output_unchecked).
@validator(name="output_rules", version="3")
def output_rules(
    *,
    patterns: tuple[str, ...] = ("secret_key", "credential"),
    custom: Mapping[str, str] | None = None,
    scopes: tuple[str, ...] = ("text", "claim", "plan"),
    verdict: str = "reject",
    max_matches: int = 20,
):
    """Codes: sensitive_output (reject, or the configured verdict),
    output_unchecked (reject: a custom pattern ran out of time).
    Params: patterns (built-in rules: secret_key, credential, email,
    credit_card, iban), custom (name -> regex), scopes (text, claim, plan,
    tool_arguments), verdict (reject or repair), max_matches."""
    rules = build_rules(patterns, {} if custom is None else custom)
    scopes = str_list_param("scopes", scopes, SCOPES)
    verdict_ = Verdict(choice_param("verdict", verdict, ("reject", "repair")))
    max_matches = int_param("max_matches", max_matches, 1)

    def check(inp: DecisionInput) -> list[Issue]:
        try:
            matches = scan_candidate(inp.candidate, rules, scopes)
        except Unchecked as exc:
            return [unchecked_issue(exc)]
        return [sensitive_issue(matches, verdict_, max_matches)] if matches else []

    return check
