"""output_rules: secrets and personal data; evidence has offsets and rule names, never the text."""

from __future__ import annotations

import pytest
from validators_helpers import call, claim, make_input, steps_of_another_thread_during, text

from loopledger.validators import ParamError, Verdict, get_factory

SECRET = "sk-live-4f9aQ2xZr8LmN3pT7vW1"
rules = get_factory("output_rules")


def test_clean_output_is_accepted():
    assert rules()(make_input([text("Refund of 25.00 issued for ORD-1042.")])).verdict is Verdict.ACCEPT


def test_secret_in_output_is_rejected_with_offsets_not_the_secret():
    msg = f"Use the key {SECRET} to retry."
    d = rules()(make_input([text("ok"), text(msg)]))
    assert (d.verdict, d.code) == (Verdict.REJECT, "sensitive_output")
    (m,) = d.evidence["matches"]
    assert m == {"rule": "secret_key", "item": 1, "field": "text", "start": 12, "end": 12 + len(SECRET)}
    assert msg[m["start"]:m["end"]] == SECRET
    assert SECRET not in d.to_json() and SECRET[8:] not in d.to_json()


@pytest.mark.parametrize(
    "value",
    ["AKIAIOSFODNN7EXAMPLE", "ghp_" + "a" * 36, "-----BEGIN RSA PRIVATE KEY-----", "password = hunter2hunter2",
     # Stripe's secret, test and restricted keys, and a webhook signing secret
     "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_test_26PHem9AhJZvU623DfE1x4sd", "rk_live_51H8xYzAbCdEfGhIjKlMnOp",
     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
)
def test_other_secret_shapes(value):
    d = rules()(make_input([text(f"x {value} y")]))
    assert d.code == "sensitive_output"


def test_a_publishable_key_is_not_a_secret():
    assert rules()(make_input([text("pk_live_51H8xYzAbCdEfGhIjKlMnOp")])).code == "ok"


def test_personal_data_only_when_configured():
    inp = make_input([text("Write to jane.doe@example.com, card 4111 1111 1111 1111.")])
    assert rules()(inp).code == "ok"
    d = rules(patterns=["email", "credit_card"])(inp)
    assert d.evidence["rules"] == ["credit_card", "email"] and d.evidence["count"] == 2


def test_card_numbers_need_a_valid_checksum():
    d = rules(patterns=["credit_card"])(make_input([text("order 4111 1111 1111 1112")]))
    assert d.code == "ok"


@pytest.mark.parametrize(("written", "iban"), [
    ("Pay to GB82WEST12345698765432 today", "GB82WEST12345698765432"),
    ("Pay to GB82 WEST 1234 5698 7654 32 today", "GB82 WEST 1234 5698 7654 32"),
    ("IBAN: DE89 3704 0044 0532 0130 00.", "DE89 3704 0044 0532 0130 00"),
    ("FR76 3000 6000 0112 3456 7890 189", "FR76 3000 6000 0112 3456 7890 189"),
    ("NO93 8601 1117 947", "NO93 8601 1117 947"),
    # A next word of four capitals is not part of it: mod-97 says where it ends.
    ("NL91 ABNA 0417 1643 00 ABCD EFGH", "NL91 ABNA 0417 1643 00"),
])
def test_ibans_whole_or_in_groups_of_four(written, iban):
    d = rules(patterns=["iban"])(make_input([text(written)]))
    (m,) = d.evidence["matches"]
    assert written[m["start"]:m["end"]] == iban


def test_two_ibans_a_space_apart_are_two_matches():
    written = "ES91 2100 0418 4502 0005 1332 DE89 3704 0044 0532 0130 00"
    d = rules(patterns=["iban"])(make_input([text(written)]))
    assert [written[m["start"]:m["end"]] for m in d.evidence["matches"]] == [
        "ES91 2100 0418 4502 0005 1332", "DE89 3704 0044 0532 0130 00"]


def test_a_grouped_number_is_checked_whole_not_cut_until_something_passes():
    """Each cut tried is one more 1-in-97 chance of a false match: groups
    with digits are never cut off (only words of letters after the number,
    or from where a next IBAN may begin)."""
    import random

    generator = random.Random(7)
    numbers = ["GB%02d" % generator.randint(0, 99) + "".join(" %04d" % generator.randint(0, 9999) for _ in range(7))
               for _ in range(3000)]
    check = rules(patterns=["iban"])
    flagged = sum(check(make_input([text(n)])).code == "sensitive_output" for n in numbers)
    assert flagged < 3000 * 2 / 97  # about 1 in 97 for the whole; cutting at every group gave about 5 in 97


@pytest.mark.parametrize("written", ["GB82 WEST 1234 5698 7654 33", "ORDER ORD1042 12345678901234", "GB82 WEST"])
def test_what_fails_mod_97_is_no_iban(written):
    assert rules(patterns=["iban"])(make_input([text(written)])).code == "ok"


def test_a_custom_pattern_that_backtracks_without_end_refuses_the_output_unchecked():
    check = rules(patterns=[], custom={"runaway": "(a|aa)+$"})
    d = check(make_input([text("ok"), text("a" * 64 + "!")]))
    assert (d.verdict, d.code) == (Verdict.REJECT, "output_unchecked")
    assert d.evidence == {"rule": "runaway", "item": 1, "field": "text", "timeout_s": 1.0}
    assert check(make_input([text("aaa")])).code == "sensitive_output"  # it still matches what it can
    # Matched without letting go of the interpreter lock (as the tool schemas' patterns are).
    assert steps_of_another_thread_during(lambda: check(make_input([text("a" * 64 + "!")]))) < 1_000_000


def test_claims_plans_and_optionally_tool_arguments_are_scanned():
    assert rules()(make_input([claim(f"key {SECRET}")])).code == "sensitive_output"
    assert rules()(make_input([{"type": "plan", "steps": [{"do": f"print {SECRET}"}]}])).evidence["matches"][0]["field"] == "$.steps[0].do"
    inp = make_input([call("workspace.write_file", {"path": "a", "content": SECRET})])
    assert rules()(inp).code == "ok"
    d = rules(scopes=["tool_arguments"])(inp)
    assert d.evidence["matches"][0]["field"] == "$.arguments.content"


def test_custom_rules_and_verdict():
    d = rules(patterns=[], custom={"ticket": r"TKT-\d{6}"}, verdict="repair")(make_input([text("see TKT-123456")]))
    assert (d.verdict, d.evidence["rules"]) == (Verdict.REPAIR, ["ticket"])


def test_bad_params_are_refused_at_build_time():
    with pytest.raises(ParamError, match="patterns"):
        rules(patterns=["secret"])
    with pytest.raises(ParamError, match="custom.bad"):
        rules(custom={"bad": "("})
    # A pattern that matches empty text would flag every output.
    for empty in ("", "x*", "(?:a|)"):
        with pytest.raises(ParamError, match="custom.any.*does not match empty text"):
            rules(custom={"any": empty})
    with pytest.raises(ParamError, match="verdict"):
        rules(verdict="ask")
    # A finding names its rules: a custom rule may not be nameless.
    for name in ("", "  "):
        with pytest.raises(ParamError, match="custom.*not empty"):
            rules(custom={name: r"TKT-\d{6}"})
