"""Durable waits for a person: resume tokens and the checks on a reply.

A run that needs an answer or an approval commits WAITING_USER with a
question artifact, the expected response schema, an expiry and the hash of
a resume token. The token itself is shown once, to whoever will reply:

    token = base64url(claims) "." hex(HMAC-SHA256(secret, claims))
    claims = {"r": run_id, "w": wait_id, "v": state_version, "e": expires_at_us}

It is bound to the run, to this wait, to the state version the run had when
the wait began, and to the expiry. A reply is accepted only if the token is
genuine (the HMAC matches), names this run and its current wait, the run is
still at that state version, the wait has not expired, and the answer fits
the schema; the commit that accepts it moves the run on by compare-and-set,
so a token is consumed once even when two replies race. The secret is per
data directory (``<home>/secret.key``, mode 0600) or ``LOOPLEDGER_SECRET``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import BadInput, EngineError

SECRET_FILE = "secret.key"


class ReplyRejected(EngineError):
    """A reply was refused; ``reason`` is one of the CONTRACT's reasons."""

    code = "reply_rejected"

    def __init__(self, run_id: str, reason: str, detail: str = "") -> None:
        super().__init__(f"run {run_id}: reply rejected: {reason}" + (f" ({detail})" if detail else ""))
        self.run_id = run_id
        self.reason = reason
        self.detail = detail

    @property
    def why(self) -> str:
        """The reason and its detail, as a rejection is told to a person."""
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


#: The shortest secret accepted: as long as the one made on first use.
MIN_SECRET_BYTES = 32


def load_secret(home: Path) -> bytes:
    """The data directory's signing secret, created on first use; or
    ``LOOPLEDGER_SECRET``. A secret shorter than ``MIN_SECRET_BYTES``, or a
    file that others than its owner may read or write, is refused
    (:class:`BadInput`): tokens signed with it could be forged."""
    env = os.environ.get("LOOPLEDGER_SECRET", "").encode("utf-8")
    if env:
        if len(env) < MIN_SECRET_BYTES:
            raise BadInput("LOOPLEDGER_SECRET", f"expected a secret of at least {MIN_SECRET_BYTES} bytes, "
                                                f"got {len(env)}")
        return env
    path = home / SECRET_FILE
    try:
        return _checked_secret(path)
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    # Written whole under a name of its own, then linked into place: a
    # process that finds the file finds it whole, never empty or half
    # written, and a crash leaves at most the temporary file behind.
    fresh = secrets.token_bytes(MIN_SECRET_BYTES)
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(fresh)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process made it first: use theirs
            return _checked_secret(path)
    finally:
        tmp.unlink(missing_ok=True)
    return fresh


def _checked_secret(path: Path) -> bytes:
    with open(path, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        secret = handle.read()
    if mode & 0o077:
        raise BadInput(str(path), f"the signing secret may be read or written by others (mode {mode & 0o777:04o}); "
                                  f"expected mode 0600: chmod 600 {path}")
    if len(secret) < MIN_SECRET_BYTES:
        raise BadInput(str(path), f"expected a signing secret of at least {MIN_SECRET_BYTES} bytes, got "
                                  f"{len(secret)}; remove the file to have a new one made (the tokens of runs "
                                  "waiting now then stop working: `loopledger token RUN_ID` issues new ones)")
    return secret


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenClaims:
    run_id: str
    wait_id: str
    state_version: int
    expires_at_us: int


def issue_token(secret: bytes, claims: TokenClaims) -> str:
    body = json.dumps(
        {"r": claims.run_id, "w": claims.wait_id, "v": claims.state_version, "e": claims.expires_at_us},
        sort_keys=True, separators=(",", ":"),
    ).encode("utf-8")
    mac = hmac.new(secret, body, hashlib.sha256).hexdigest()
    return f"{_b64(body)}.{mac}"


def read_token(secret: bytes, run_id: str, token: str) -> TokenClaims:
    """The claims of a genuine token, or ReplyRejected('bad token')."""
    try:
        body_text, mac = token.strip().split(".", 1)
        body = _unb64(body_text)
    except (ValueError, TypeError):
        raise ReplyRejected(run_id, "bad token", "not a loopledger resume token") from None
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        raise ReplyRejected(run_id, "bad token", "signature does not match")
    try:
        raw: Any = json.loads(body)
        return TokenClaims(str(raw["r"]), str(raw["w"]), int(raw["v"]), int(raw["e"]))
    except (ValueError, KeyError, TypeError):
        raise ReplyRejected(run_id, "bad token", "malformed claims") from None


@dataclass(frozen=True)
class Reply:
    """What a person answered: an approval decision, or an answer; ``by``
    (who answered) and ``note`` (why), when they say so, are kept with it."""

    approve: bool | None = None
    answer: Any = None
    by: str | None = None
    note: str | None = None

    def describe(self) -> dict[str, Any]:
        said: dict[str, Any] = ({"decision": "approve" if self.approve else "deny"} if self.approve is not None
                                else {"answer": self.answer})
        if self.by is not None:
            said["by"] = self.by
        if self.note is not None:
            said["note"] = self.note
        return said


def check_answer(run_id: str, waiting: dict[str, Any], reply: Reply) -> None:
    """The reply fits the wait: a decision for an approval, an answer that
    matches the expected JSON Schema for a question."""
    if waiting["kind"] == "approval":
        if reply.approve is None:
            raise ReplyRejected(run_id, "answer not matching the expected schema",
                                "this wait is an approval: reply with --approve or --deny")
        return
    if reply.approve is not None:
        raise ReplyRejected(run_id, "answer not matching the expected schema",
                            "this wait asks a question: reply with --answer JSON")
    schema = waiting.get("schema", {})
    from loopledger.validators._jsonschema import BoundedValidator, unusable

    # Such a question cannot be answered (the engine no longer asks one; a
    # run recorded before may still wait on one): say so instead of failing.
    why = unusable(schema)
    try:
        if why is None:
            errors = sorted(BoundedValidator(schema).iter_errors(reply.answer), key=lambda e: list(e.path))
    except Exception as exc:  # noqa: BLE001 - a schema jsonschema fails on while applying it
        why = _one_line(exc)
    if why is not None:
        raise ReplyRejected(run_id, "answer not matching the expected schema",
                            f"the question's schema is not a valid JSON Schema ({why}); cancel the run") from None
    if errors:
        first = errors[0]
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.path)
        raise ReplyRejected(run_id, "answer not matching the expected schema", f"{where}: {first.message}")


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(text.split())[:200]
