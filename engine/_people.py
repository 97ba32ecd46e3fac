"""The controller's dealings with people: waits, replies, expiry and
cancellation (see docs/engine.md, "The wait protocol").

A mixin of :class:`~loopledger.engine._controller.Controller`: these methods
commit through the controller's own ``_commit``/``_move`` and record results
through its ``_record_result``, so a person's answer takes exactly the path
a tool's result does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from loopledger.canonical import content_id

from ._backends import ToolOutcome, failure
from ._clock import from_us, now_us
from ._errors import StaleStateVersion, TerminalAlreadySet
from ._records import Artifact, Commit, NewEvent
from ._refused import tool_call_items, with_refusals
from ._states import TERMINAL, State
from ._tools import EVIDENCE_KIND, evidence_subject
from ._view import OpView, RunView
from ._waits import Reply, ReplyRejected, TokenClaims, check_answer, issue_token, read_token, token_hash

#: How long a person's reply (or a cancel) waits for another process that
#: drives the run to let go of it, before leaving the run to that process.
HANDOVER_WAIT_S = 30.0

if TYPE_CHECKING:
    from ._controller import RunConfig


def wait_over(waiting: dict[str, Any] | None) -> bool:
    """Whether a wait for a person has run out (its expiry, or the run's
    deadline that ended it, has passed)."""
    return now_us() >= (waiting or {}).get("expires_at_us", 1 << 62)


def _cancelled(run_id: str, state: State, before: str = "") -> ReplyRejected:
    """The refusal of a reply or a token because the run's cancel was asked for."""
    return ReplyRejected(run_id, "cancelled", f"the run's cancellation was requested{before}; it is {state.value}")


def record_cancel(store: Any, run_id: str) -> str:
    """Record a request to cancel ``run_id``, through the journal alone (no
    tool backend is opened: a driver stalled in a send may hold it).
    Appended at the run's head whatever its state version, so a process
    driving the run cannot outrun it: that process meets it at its next
    commit and cancels the run itself. Returns ``"recorded"``; ``"ended"``
    when the run already ended (a request that meets the end is kept as a
    late event); ``"wait over"`` when it waits for a person and that wait
    ran out (its expiry, or the run's deadline) before this request: nothing
    is recorded, and the run is to end as its wait says."""
    record = store.get_run(run_id)
    if record.state is State.WAITING_USER and wait_over(record.waiting):
        return "wait over"
    try:
        store.append_at_head(run_id, (NewEvent("cancel_requested", {}),))
    except TerminalAlreadySet:
        return "ended"
    return "recorded"


def _not_waiting(view: RunView) -> ReplyRejected:
    """The refusal of a reply to a run that waits for none: its cancel was
    asked for, or it is in another state."""
    if view.cancel_requested:
        return _cancelled(view.run_id, view.state)
    return ReplyRejected(view.run_id, "stale state version", f"the run is {view.state.value}, not waiting")


class PeopleMixin:
    def _wait_user(self, view: RunView, config: RunConfig, kind: str, question: dict[str, Any],
                   recorded: dict[str, Any], operation: OpView | None = None) -> None:
        """Commit WAITING_USER: the question artifact, the schema the answer
        must fit, the expiry, and only the hash of the resume token."""
        artifact = Artifact("question", {"kind": kind, **question})
        expires = now_us() + int(config.scenario.contract.wait_ttl_s * 1_000_000)
        # A wait ends at the run's deadline when that comes first: past it no
        # reply could do anything, so the token and ``expires_at`` say so.
        deadline_s = config.scenario.budgets.deadline_s
        deadline = view.started_at + int(deadline_s * 1_000_000) if deadline_s is not None else None
        by_deadline = deadline is not None and deadline < expires
        if by_deadline:
            expires = deadline
        version_after = view.state_version + 1
        wait_id = f"{view.run_id}.w{version_after}"
        token = issue_token(self.secret, TokenClaims(view.run_id, wait_id, version_after, expires))
        waiting = {
            "kind": kind,
            "wait_id": wait_id,
            "approval_id": wait_id if kind == "approval" else None,
            "operation_id": operation.operation_id if operation else None,
            "question_id": artifact.artifact_id,
            "question": question.get("question", ""),
            "schema": question.get("schema") or {},
            "reason": question.get("reason"),  # why a person is asked: an approval's reason, OBJECT_AMBIGUOUS
            "expires_at_us": expires,
            "expires_at": from_us(expires).isoformat(),
            "ends_with": "deadline" if by_deadline else "wait_ttl",
            "state_version": version_after,
            "token_hash": token_hash(token),
        }
        reason = "waiting_for_approval" if kind == "approval" else "waiting_for_user"
        extra = dict(recorded)
        extra["artifacts"] = tuple(recorded.get("artifacts", ())) + (artifact,)
        if kind == "approval" and operation is not None:
            # The request's result while a person decides (the operations
            # table shows it); the decision replaces it with the send's own
            # result, or permission_denied.
            extra["operation_updates"] = (*recorded.get("operation_updates", ()),
                                          {"operation_id": operation.operation_id, "outcome": "approval_required"})
        self._move(view, State.WAITING_USER, payload={"waiting": waiting},
                   set_fields={"reason": reason, "waiting_json": waiting}, **extra)
        # Shown once, to whoever delivers the reply; the journal has its hash only.
        view.new_token = token

    def reissue_token(self, run_id: str) -> RunView:
        """A new resume token for the run's current wait, for a token that
        was lost before anyone saw it (the process died between the commit
        that began the wait and printing it). The commit moves the run's
        state version on, so the earlier token, if it exists, stops working;
        the wait itself (question, schema, expiry) is unchanged. Whoever can
        run this holds the data directory's secret anyway."""
        view, record = self._load(run_id)
        # As for a reply: a token from a data directory that cannot drive the
        # run (another's, on a shared journal) could never be used, and it
        # would void the token of the one that can.
        self._config_here(view, record)
        waiting = view.waiting
        if view.state is not State.WAITING_USER or waiting is None:
            if view.cancel_requested:
                raise _cancelled(run_id, view.state)
            raise ReplyRejected(run_id, "not waiting", f"the run is {view.state.value}, not waiting for a person")
        self._refuse_if_cancelling(view)
        if now_us() >= waiting["expires_at_us"]:
            # A token for a wait that is over could only be refused.
            self._refuse_expired(run_id, waiting)
        version_after = view.state_version + 1
        token = issue_token(self.secret, TokenClaims(run_id, waiting["wait_id"], version_after,
                                                     waiting["expires_at_us"]))
        renewed = {**waiting, "state_version": version_after, "token_hash": token_hash(token)}
        try:
            self._commit(view, Commit(run_id, view.state_version, None,
                                      events=(NewEvent("token_reissued", {"wait_id": waiting["wait_id"],
                                                                          "waiting": renewed}),),
                                      set_fields={"waiting_json": renewed}))
        except (StaleStateVersion, TerminalAlreadySet):
            raise ReplyRejected(run_id, "stale state version", "the run moved on meanwhile; try again") from None
        view.new_token = token
        return view

    def _refuse_if_cancelling(self, view: RunView) -> None:
        """A run whose cancellation was asked for takes no reply and no new
        token: this process carries the cancel out (or leaves it to the one
        driving the run), and what was asked of it is refused."""
        if not view.cancel_requested:
            return
        ended = self.drive(view.run_id, wait_s=HANDOVER_WAIT_S)
        raise _cancelled(view.run_id, ended.state, " before this")

    def _refuse_expired(self, run_id: str, waiting: dict[str, Any]) -> NoReturn:
        """The wait is over: the run ends EXPIRED (through FINALIZING), and
        what was asked of it is refused."""
        self.drive(run_id, wait_s=HANDOVER_WAIT_S)
        if waiting.get("ends_with") == "deadline":
            raise ReplyRejected(run_id, "expired", f"the run's deadline passed at {waiting['expires_at']}, "
                                                   "and the wait ended with it")
        raise ReplyRejected(run_id, "expired", f"the wait expired at {waiting['expires_at']}")

    def reply(self, run_id: str, token: str, reply: Reply) -> RunView:
        """Deliver a person's reply to a waiting run and drive it on."""
        # As the token is read: space around it (pasted, or `$(cat file)`
        # with its newline) is not part of it.
        token = token.strip()
        view, record = self._load(run_id)  # an unknown run is said as such, whatever the token
        claims = read_token(self.secret, run_id, token)
        if claims.run_id != run_id:
            raise ReplyRejected(run_id, "wrong run", f"the token is for run {claims.run_id}")
        digest = token_hash(token)
        if view.state in TERMINAL:
            self._keep_late_reply(view, record, claims, digest, reply)
        # Before the reply is taken: this process must be able to drive the
        # run on (its backend, its model), or the reply would wait unused.
        self._config_here(view, record)
        if digest in view.consumed_tokens:
            raise ReplyRejected(run_id, "already used")
        waiting = view.waiting
        if view.state is not State.WAITING_USER or waiting is None:
            raise _not_waiting(view)
        self._refuse_if_cancelling(view)
        if claims.wait_id != waiting["wait_id"] or claims.state_version != view.state_version:
            raise ReplyRejected(run_id, "stale state version",
                                f"the token is for state version {claims.state_version}; "
                                f"the run is at {view.state_version}")
        if digest != waiting["token_hash"]:
            raise ReplyRejected(run_id, "bad token", "not the token issued for this wait")
        if now_us() >= claims.expires_at_us:
            self._refuse_expired(run_id, waiting)
        check_answer(run_id, waiting, reply)
        recorded = self._backend_record(view, waiting, reply)
        try:
            self._accept_reply(view, waiting, digest, reply, recorded)
        except (StaleStateVersion, TerminalAlreadySet):
            # Another reply (or a cancel) moved the run between the checks
            # and the commit: the compare-and-set refused this one.
            self._refuse_if_cancelling(self.load(run_id))  # a cancel is said as such
            raise ReplyRejected(run_id, "stale state version",
                                "the run moved on while the reply was checked") from None
        # Another process may be driving the run (a resume that found it
        # moving): it goes on with it, or lets go soon.
        return self.drive(run_id, wait_s=HANDOVER_WAIT_S)

    def _keep_late_reply(self, view: RunView, record: Any, claims: TokenClaims, digest: str,
                         reply: Reply) -> NoReturn:
        """Refuse a reply to an ended run, and keep it as a late event (kind
        ``reply_after_end``; the run's outcome stands): the token is one this
        data directory signed for the run, so the reply is the person's,
        whichever process can drive the run. An answer is kept by its
        hash: the run can do nothing with it, and a retried reply should
        not grow the journal by the answer each time."""
        if digest in view.consumed_tokens:
            refusal = ReplyRejected(view.run_id, "already used")
        elif view.state in (State.EXPIRED, State.BUDGET_EXHAUSTED) and now_us() >= claims.expires_at_us:
            # The wait this token was for ran out (its own expiry, or the
            # run's deadline), and the run ended with it.
            refusal = ReplyRejected(view.run_id, "expired", f"the wait expired and the run ended "
                                                            f"{view.state.value} ({record.reason})")
        else:
            refusal = _not_waiting(view)
        said = reply.describe()
        if "answer" in said:
            said["answer_sha256"] = content_id(said.pop("answer"))
        late = NewEvent("reply_after_end", {"wait_id": claims.wait_id, "token_hash": digest,
                                            "refused": refusal.reason, **said})
        try:
            self.store.append_at_head(view.run_id, (late,))
        except TerminalAlreadySet:
            pass  # kept, as a late_event
        raise refusal

    def _backend_record(self, view: RunView, waiting: dict[str, Any], reply: Reply) -> ToolOutcome | None:
        """For a person's word on whether an operation took effect: what its
        backend records under the operation's key now. A record is the
        operation's result, whatever the person says; a "yes" that a backend
        able to look the key up has no record of is refused (the run would
        claim an effect that never happened). None when the backend cannot
        say (the person's word stands) or the reply is of another kind."""
        op = view.ops.get(waiting.get("operation_id") or "")
        if (op is None or waiting["kind"] != "user" or op.tool == "ask_user" or not isinstance(reply.answer, dict)
                or "executed" not in reply.answer):
            return None
        found = self._lookup(view, op)
        if found is None and reply.answer.get("executed"):
            raise ReplyRejected(view.run_id, "contradicted by the backend",
                                f"{op.tool} has no record under the operation's idempotency key: it did not take "
                                'effect; answer {"executed": false}')
        return found if found is not None and found.outcome != "unknown_outcome" else None

    def _accept_reply(self, view: RunView, waiting: dict[str, Any], digest: str, reply: Reply,
                      recorded: ToolOutcome | None = None) -> None:
        op = view.ops.get(waiting["operation_id"]) if waiting.get("operation_id") else None
        resolved = {"wait_id": waiting["wait_id"], "kind": waiting["kind"], "token_hash": digest,
                    "operation_id": op.operation_id if op else None, "actor": view.tenant,
                    "state_version": view.state_version, **reply.describe()}
        events = [NewEvent("reply_accepted", resolved)]
        if op is None:
            # An answer to the model's own question: it goes back to the model.
            resolved["message"] = f"The user answered: {reply.answer!r}"
            self._commit(view, Commit(view.run_id, view.state_version, State.READY, events=tuple(events),
                                      payload={"replied": waiting["wait_id"]}, set_fields={"waiting_json": None}))
            return
        if waiting["kind"] == "approval" and reply.approve:
            # The send is next: the request has no result until it comes.
            self._commit(view, Commit(view.run_id, view.state_version, State.TOOL_RUNNING, events=tuple(events),
                                      payload={"approved": op.operation_id}, set_fields={"waiting_json": None},
                                      operation_updates=({"operation_id": op.operation_id, "outcome": None},)))
            return
        # A denial, an answer to ask_user, or a person's word on an unknown
        # outcome: each is the operation's one terminal result.
        if waiting["kind"] == "approval":
            # The model replans from this result: who said no, and why, if they said.
            why = "the approval was denied" + (f" by {reply.by}" if reply.by else "")
            outcome = failure("permission_denied", "APPROVAL_DENIED", why + (f": {reply.note}" if reply.note else ""))
        elif op.tool == "ask_user":
            outcome = ToolOutcome(outcome="success", status="succeeded", result={"answer": reply.answer},
                                  evidence=({"kind": "user_answer", "subject": waiting["wait_id"]},),
                                  error_code=None, retry_after_s=None, work_id=None, executed=True)
        elif recorded is not None:
            # The backend has it on record after all: its record is the result.
            outcome = recorded
        elif reply.answer.get("executed"):
            # A person checked the backend and found the effect: it happened.
            # Their word is the evidence (marked as theirs), so the gate can
            # accept an answer built on it instead of the model doing it again.
            evidence = ({"kind": EVIDENCE_KIND[op.tool], "subject": evidence_subject(op.tool, op.arguments),
                         "confirmed_by": "person"},) if op.tool in EVIDENCE_KIND else ()
            outcome = ToolOutcome(outcome="success", status="succeeded",
                                  result={"confirmed_by": "person", **reply.answer}, evidence=evidence,
                                  error_code=None, retry_after_s=None, work_id=None, executed=True)
        else:
            outcome = ToolOutcome(outcome="cancelled", status="failed",
                                  result={"error": "NOT_EXECUTED", "confirmed_by": "person", **reply.answer},
                                  evidence=(), error_code="NOT_EXECUTED", retry_after_s=None, work_id=None,
                                  executed=False)
        if recorded is not None:
            resolved["backend_record"] = recorded.outcome  # the backend's record, not the person's word
        # One commit: a reply consumed but not applied would leave the run
        # waiting on a wait nobody can answer any more.
        self._record_result(view, op, outcome, to=State.TOOL_RUNNING, before=tuple(events),
                            payload={"replied": waiting["wait_id"]}, set_fields={"waiting_json": None})
        if outcome.outcome not in ("success", "background_accepted"):
            self._cancel_rest(view)

    def _expire_if_due(self, view: RunView) -> bool:
        """An expired wait ends the run EXPIRED (BUDGET_EXHAUSTED /
        ``deadline`` when the run's deadline ended it); an operation it held
        gets its terminal result (denied, or cancelled). True when it
        expired."""
        waiting = view.waiting or {}
        if view.state is not State.WAITING_USER or not wait_over(view.waiting):
            return False
        op = view.ops.get(waiting["operation_id"]) if waiting.get("operation_id") else None
        deadline = waiting.get("ends_with") == "deadline"
        if op is not None and not op.settled and op.in_flight:
            # A send nobody confirmed (the person asked whether it took
            # effect never answered): its backend's record is its result; no
            # record, under this process's claim, is a confirmed "not
            # executed"; a backend that cannot say leaves it unknown.
            code = "DEADLINE" if deadline else "WAIT_EXPIRED"
            found = self._lookup(view, op)
            if found is None:
                found = failure("cancelled", code, f"{op.tool}: not executed (its backend has no record of it); "
                                                   "the wait for a person to confirm it ran out")
            elif found.outcome == "unknown_outcome":
                found = failure("unknown_outcome", code, f"{op.tool} was sent and nobody confirmed whether it "
                                                         "took effect before the wait ran out")
            self._record_result(view, op, found)
        elif op is not None and not op.settled:
            if deadline:
                outcome = ToolOutcome(outcome="cancelled", status="failed",
                                      result={"error": "DEADLINE", "deadline_at": waiting.get("expires_at")},
                                      evidence=(), error_code="DEADLINE", retry_after_s=None, work_id=None,
                                      executed=False)
            else:
                outcome = ToolOutcome(
                    outcome="permission_denied" if waiting["kind"] == "approval" else "cancelled", status="failed",
                    result={"error": "WAIT_EXPIRED", "expired_at": waiting.get("expires_at")}, evidence=(),
                    error_code="WAIT_EXPIRED", retry_after_s=None, work_id=None, executed=False)
            self._record_result(view, op, outcome)
        self._cancel_rest(view, "DEADLINE" if deadline else "PRECEDING_CALL_FAILED")
        status, reason = ("BUDGET_EXHAUSTED", "deadline") if deadline else ("EXPIRED", "expired")
        self._finalize(view, status, reason, extra={"set_fields": {"waiting_json": None}})
        return True

    # -- cancellation -------------------------------------------------------------------

    def request_cancel(self, run_id: str) -> bool:
        """Record a cancellation request; False when the run already ended
        (or its wait ran out before it: see :func:`record_cancel`)."""
        return record_cancel(self.store, run_id) == "recorded"

    def _cancel(self, view: RunView) -> None:
        """Settle the sends in flight, stop pending work, then end CANCELLED,
        or CANCEL_UNKNOWN where a backend cannot confirm an outcome or a
        stop."""
        unconfirmed: list[str] = []
        # This process holds the run's claim (``drive``): whoever sent a
        # request in flight is gone, or fenced off by the lookup's claim
        # number. Without the claim the sender may still be sending.
        mine = self.store.still_holds(view.run_id)
        for op in view.step_ops():
            if op.in_flight:
                # Sent, its answer never recorded. What its backend recorded
                # under the key is its one result (first: work it accepted is
                # pending work, stopped below). Under the claim, no record is
                # a confirmed "not executed", as reconciliation takes it (a
                # read-only tool has no effect to record). Otherwise, or when
                # the backend cannot say, the outcome, and so the cancel, is
                # unknown.
                found = self._lookup(view, op)
                if found is None and mine:
                    found = ToolOutcome(outcome="cancelled", status="failed",
                                        result={"error": "CANCELLED", "executed": False}, evidence=(),
                                        error_code="CANCELLED", retry_after_s=None, work_id=None, executed=False)
                elif found is None or found.outcome == "unknown_outcome":
                    unconfirmed.append(op.operation_id)
                    found = failure("unknown_outcome", "CANCELLED_IN_FLIGHT",
                                    f"{op.tool} was sent and its answer never recorded; the run was cancelled "
                                    "before anyone could confirm whether it took effect")
                self._record_result(view, op, found)
        unconfirmed += self._stop_background(view)
        for op in view.unsettled_ops():
            if not op.in_flight:
                # Never sent: pure records, held and written with the move
                # to FINALIZING, in one transaction (a step of a thousand
                # calls is one commit, not a thousand).
                self._record_result(view, op, ToolOutcome(
                    outcome="cancelled", status="failed", result={"error": "CANCELLED"}, evidence=(),
                    error_code="CANCELLED", retry_after_s=None, work_id=None, executed=False), hold=True)
        extra: dict[str, Any] = {"set_fields": {"waiting_json": None}}
        if view.state is State.VALIDATING:
            # A candidate nobody judged: its calls are never sent.
            extra = with_refusals(extra, view, [
                (item, "cancelled", "CANCELLED", "not run: the run was cancelled before its candidate was judged")
                for item in tool_call_items(view.candidate_items)])
        status = "CANCEL_UNKNOWN" if unconfirmed else "CANCELLED"
        self._finalize(view, status, "cancelled", extra=extra,
                       payload_extra={"unconfirmed": unconfirmed} if unconfirmed else None)
