"""The decision model: JSON round trip, parse errors, exported members."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loopledger.validators as v
from loopledger.validators import Decision, DecisionInput, InputError, Verdict, split_tool_name

_names = st.text(alphabet=string.ascii_lowercase + "._", min_size=1, max_size=12)
_json_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8) | st.floats(
    allow_nan=False, allow_infinity=False, width=32
)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_obj = st.dictionaries(st.text(max_size=6), _json, max_size=4)

_items = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=20)),
    st.builds(
        lambda cid, name, args, raw, ver: {"type": "tool_call", "call_id": cid, "name": name, "version": ver,
                                           **({"raw_arguments": raw} if args is None else {"arguments": args})},
        st.text(min_size=1, max_size=5), _names, st.none() | _obj, st.text(max_size=10), st.none() | _names,
    ),
    st.builds(lambda t, ev: {"type": "claim", "text": t, "evidence": ev}, st.text(max_size=10), st.lists(_names, max_size=3)),
    st.builds(lambda steps: {"type": "plan", "steps": steps}, st.lists(_json, max_size=3)),
)
_step = st.builds(
    lambda s, calls, errors, ne, co, cand: {"run_id": "r", "step": s, "states": ["READY", "MODEL_RUNNING"],
                                            "calls": calls, "errors": errors, "new_evidence": ne,
                                            "completed_operations": co, "candidates": cand},
    st.integers(1, 50), st.lists(_names, max_size=2), st.lists(_names, max_size=2), st.integers(0, 3),
    st.integers(0, 3), st.none() | st.integers(0, 9),
)
_inputs = st.builds(
    lambda items, finish, tools, req, forbidden, allowed, tenant, budget, evidence, ops, pending, history, extra: {
        "run_id": "run-x",
        "step": 3,
        "attempt": 1,
        "candidate": {"items": items, "finish_reason": finish},
        "context": {
            "messages": [{"role": "user", "content": "go"}],
            "tools": tools,
            "policy": {"approval_required": ["deploy.service"], **extra},
            "contract": {"goal": "g", "required_evidence": req, "allowed_tools": allowed,
                         "forbidden_paths": forbidden, "wait_ttl_s": 60, "version": 2},
            "tenant": tenant,
            "budget": budget,
        },
        "proposal": [{"call_id": "c", "tool": "t", "version": None, "arguments": {"path": "a/b"},
                      "resources": [{"kind": "workspace_path", "argument": "path", "raw": "./a/b", "value": "a/b"}],
                      "args_hash": "0" * 64}],
        "facts": {"evidence": evidence, "operations": ops, "pending": pending, "error_codes": ["RATE_LIMIT"],
                  "history": history},
    },
    st.lists(_items, max_size=4),
    st.sampled_from(["stop", "tool_calls", "length", "content_filter", "error", "incomplete"]),
    st.lists(st.builds(lambda n, ver, sch: {"name": n, "version": ver, "schema": sch}, _names, st.none() | _names, _obj), max_size=3),
    st.lists(_names, max_size=3),
    st.lists(_names, max_size=2),
    st.none() | st.lists(_names, max_size=2),
    st.none() | _names,
    st.dictionaries(_names, st.none() | st.integers(0, 100) | st.floats(0, 10, allow_nan=False), max_size=3),
    st.lists(st.builds(lambda k, s: {"kind": k, "subject": s, "operation_id": "op", "step": 1}, _names, st.none() | _names), max_size=3),
    st.lists(st.builds(lambda o: {"operation_id": "op-1", "tool": "t", "outcome": o, "error_code": None},
                       st.sampled_from(["success", "timeout", "unknown_outcome", "background_accepted"])), max_size=2),
    st.lists(st.builds(lambda k: {"kind": k, "id": "p1", "tool": None},
                       st.sampled_from(["operation", "approval", "background", "user"])), max_size=2),
    st.lists(_step, max_size=3),
    st.dictionaries(st.sampled_from(["max_risk", "notes"]), _json, max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(_inputs)
def test_decision_input_round_trips_exactly(raw):
    inp = DecisionInput.model_validate(raw)
    text = inp.to_json()
    back = DecisionInput.from_json(text)
    assert back == inp
    assert back.to_json() == text


def test_decision_round_trip_and_severity_order():
    d = Decision(verdict="repair", code="invalid_arguments", message="m", evidence={"path": "$.a"},
                 validator="tool_args_schema", validator_version="1")
    assert Decision.from_json(d.to_json()) == d
    assert [x.severity for x in (Verdict.ACCEPT, Verdict.REPAIR, Verdict.ASK, Verdict.REJECT)] == [0, 1, 2, 3]


def test_from_json_names_the_bad_field():
    with pytest.raises(InputError, match=r"candidate\.finish_reason"):
        DecisionInput.from_json('{"candidate": {"items": [], "finish_reason": "done"}}')
    with pytest.raises(InputError, match="not JSON"):
        DecisionInput.from_json("{nope")


def test_split_tool_name_keeps_the_version_the_model_wrote():
    assert split_tool_name("deploy.service@v1", None) == ("deploy.service", "v1")
    assert split_tool_name("deploy.service@v1", "v2") == ("deploy.service", "v1")
    assert split_tool_name("orders.get_order", None) == ("orders.get_order", None)
    assert split_tool_name("a@", "v3") == ("a@", "v3")


def test_all_lists_exactly_the_public_names():
    public = {name for name in dir(v) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(v, name)).__name__ == "module"}
    assert set(v.__all__) == public - modules
    assert len(v.__all__) == len(set(v.__all__))
