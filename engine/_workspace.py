"""Tenant workspaces of the demo backend: a sandboxed directory per tenant.

Layout: ``<home>/workspaces/<tenant>/``, seeded on first use with ``src/``,
``tests/`` and ``payments/provider/`` (see :data:`SEED_FILES`).

Every path goes through two gates, in this order:

1. **Lexical**: :func:`loopledger.validators.canonical_workspace_path`, the
   same function the engine used before authorising the call, so the path
   that was authorised is the path that is touched (absolute paths,
   backslashes and ``..`` above the root are refused here).
2. **On disk**: the canonical path is joined to the tenant root and resolved
   with symlinks followed (``os.path.realpath``); the result must be the
   root or inside it. A symlink that points out of the workspace is refused.

A symlink that stays inside the workspace is followed, which means the file
touched can have a different name than the one authorised
(``src/link/config.json`` may really be ``payments/config.json``). So the
contract's forbidden globs, when the caller passes them, are checked against
both the canonical path and the resolved one.

What this sandbox assumes: nothing but the backend changes the workspace
while a call runs (a symlink swapped between the check and the open could
redirect a parent directory; the final component is opened with
``O_NOFOLLOW`` so it cannot), and a case-sensitive, non-normalising file
system (Linux). On macOS' default file system ``Payments/x`` names
``payments/x``, which a case-sensitive glob does not see.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopledger.validators import PathRejected, canonical_workspace_path, glob_matches

__all__ = ["ABSENT", "SEED_FILES", "ResolvedPath", "ToolRefused", "Workspaces", "content_version", "printable", "seed_files"]

#: Largest file read or written, in bytes: a tool result is an artifact, and
#: a workspace is source code, not a data lake.
MAX_FILE_BYTES = 1_048_576
#: Resource version of a file that does not exist (for ``expected_resource_version``).
ABSENT = "absent"

#: A tenant's name: it names a folder, so no separators and no dot first.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


class ToolRefused(Exception):
    """A demo tool call cannot proceed; the backend turns it into a ToolOutcome.

    Internal to the demo backends (never escapes ``DemoBackend.execute``).
    ``outcome`` is ``permission_denied`` (the sandbox or tenant boundary said
    no) or ``validation_failed`` (the tool refused the request or reported
    an error such as ``NOT_FOUND``); ``details`` go into the result next to
    the message.
    """

    def __init__(self, outcome: str, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class ResolvedPath:
    canonical: str  # what was authorised, e.g. ``src/app.py``; ``.`` is the root
    real: str  # absolute path on disk after symlinks
    relative: str  # ``real`` relative to the tenant root, ``/``-separated


def content_version(data: bytes | None) -> str:
    """A file's resource version: sha256 of its bytes, or ``absent``."""
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()


def printable(raw: Any) -> str:
    """``raw`` as text that is safe in canonical JSON (no lone surrogates)."""
    text = raw if isinstance(raw, str) else repr(raw)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Workspaces:
    """All tenant workspaces under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- roots ------------------------------------------------------------

    def root_for(self, tenant: str) -> str:
        """The tenant's root (real path), seeding it on first use."""
        if not isinstance(tenant, str) or not TENANT_NAME.match(tenant):
            raise ToolRefused("permission_denied", "PERMISSION_DENIED", f"invalid tenant name {printable(tenant)!r}")
        path = self.root / tenant
        if not path.is_dir():
            self._seed(tenant, path)
        return os.path.realpath(path)

    def _seed(self, tenant: str, path: Path) -> None:
        # Built aside and renamed into place: another process seeding the same
        # tenant at the same time either wins the rename or finds it done, and
        # nobody ever sees a half-seeded workspace.
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".seed-{tenant}-{os.getpid()}-{secrets.token_hex(4)}"
        for rel, text in seed_files(tenant).items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        try:
            os.rename(staging, path)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not path.is_dir():
                raise

    # -- the two gates ------------------------------------------------------

    def resolve(self, tenant: str, raw: Any, forbidden: tuple[str, ...] = ()) -> ResolvedPath:
        root = self.root_for(tenant)
        try:
            canonical = canonical_workspace_path(raw)
        except PathRejected as exc:
            raise ToolRefused(
                "permission_denied", "PERMISSION_DENIED", f"path {printable(raw)!r} refused: {exc.reason}",
                path=printable(raw), reason=exc.reason,
            ) from None
        joined = root if canonical == "." else os.path.join(root, *canonical.split("/"))
        try:
            real = os.path.realpath(joined)
        except (OSError, ValueError) as exc:  # unencodable names, overlong paths
            raise ToolRefused("permission_denied", "PERMISSION_DENIED",
                                   f"path {canonical!r} cannot be resolved: {exc}", path=canonical) from None
        if real != root and not real.startswith(root + os.sep):
            raise ToolRefused(
                "permission_denied", "PERMISSION_DENIED",
                f"path {canonical!r} resolves outside the workspace (through a symlink)",
                path=canonical, reason="symlink leaves the workspace",
            )
        probe = real
        while len(probe) > len(root):
            # realpath leaves a symlink loop unresolved and carries on
            # lexically; a write would replace the link, a read fail late.
            if os.path.islink(probe):
                raise ToolRefused("permission_denied", "PERMISSION_DENIED", f"path {canonical!r} runs into a symlink loop",
                                  path=canonical, reason="symlink loop")
            probe = os.path.dirname(probe)
        relative = "." if real == root else os.path.relpath(real, root).replace(os.sep, "/")
        for pattern in forbidden:
            for spelling in {canonical, relative}:
                if glob_matches(pattern, spelling):
                    raise ToolRefused(
                        "permission_denied", "PERMISSION_DENIED",
                        f"path {canonical!r} (on disk {relative!r}) matches forbidden path {pattern!r}",
                        path=canonical, reason="forbidden path", pattern=pattern,
                    )
        return ResolvedPath(canonical, real, relative)

    # -- operations -----------------------------------------------------------

    def read_file(self, tenant: str, raw: Any, forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
        where = self.resolve(tenant, raw, forbidden)
        data = _read_bytes(where)
        if data is None:
            raise ToolRefused("validation_failed", "NOT_FOUND", f"no file {where.canonical!r}", path=where.canonical)
        return {
            "path": where.canonical,
            "content": data.decode("utf-8", "replace"),
            "size": len(data),
            "sha256": content_version(data),
        }

    def list(self, tenant: str, raw: Any, forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
        where = self.resolve(tenant, raw, forbidden)
        try:
            names = sorted(os.listdir(where.real))
        except FileNotFoundError:
            raise ToolRefused("validation_failed", "NOT_FOUND", f"no directory {where.canonical!r}", path=where.canonical) from None
        except NotADirectoryError:
            if not os.path.isfile(where.real):  # README.md/x names nothing
                raise ToolRefused("validation_failed", "NOT_FOUND", f"no directory {where.canonical!r}", path=where.canonical) from None
            raise ToolRefused("validation_failed", "NOT_A_DIRECTORY", f"{where.canonical!r} is a file", path=where.canonical) from None
        except OSError as exc:
            raise ToolRefused("validation_failed", "IO_ERROR", f"cannot list {where.canonical!r}: {exc.strerror}") from None
        entries = []
        hidden = 0
        for name in names:
            child = name if where.canonical == "." else f"{where.canonical}/{name}"
            child_real = name if where.relative == "." else f"{where.relative}/{name}"
            # Forbidden entries are out of scope: not even their names are shown.
            if any(glob_matches(p, child) or glob_matches(p, child_real) for p in forbidden):
                hidden += 1
                continue
            full = os.path.join(where.real, name)
            if os.path.islink(full):
                entries.append({"name": printable(name), "type": "symlink"})
            elif os.path.isdir(full):
                entries.append({"name": printable(name), "type": "dir"})
            else:
                entries.append({"name": printable(name), "type": "file", "size": os.path.getsize(full)})
        return {"path": where.canonical, "entries": entries, "hidden": hidden}

    def current_version(self, tenant: str, raw: Any, forbidden: tuple[str, ...] = ()) -> str:
        where = self.resolve(tenant, raw, forbidden)
        return content_version(_read_bytes(where))

    def write_file(self, tenant: str, raw: Any, content: str, forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
        where = self.resolve(tenant, raw, forbidden)
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > MAX_FILE_BYTES:
            raise ToolRefused("validation_failed", "FILE_TOO_LARGE", f"{len(data)} bytes; at most {MAX_FILE_BYTES}")
        if where.canonical == "." or os.path.isdir(where.real):
            raise ToolRefused("validation_failed", "IS_A_DIRECTORY", f"{where.canonical!r} is a directory", path=where.canonical)
        existed = os.path.lexists(where.real)
        parent = os.path.dirname(where.real)
        tmp = os.path.join(parent, f".lltmp-{secrets.token_hex(6)}")
        try:
            os.makedirs(parent, exist_ok=True)
            # Written aside, flushed, then renamed over the target: a reader
            # (or a crash) sees the old file or the new one, never half of it.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, where.real)
        except OSError as exc:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise ToolRefused("validation_failed", "IO_ERROR", f"cannot write {where.canonical!r}: {exc.strerror}",
                                   path=where.canonical) from None
        return {"path": where.canonical, "bytes": len(data), "sha256": content_version(data), "created": not existed}


def _read_bytes(where: ResolvedPath) -> bytes | None:
    try:
        # O_NOFOLLOW: the last component was resolved a moment ago; if it is
        # a symlink now, someone swapped it, and following it is not allowed.
        fd = os.open(where.real, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):  # README.md/x names nothing
        return None
    except IsADirectoryError:
        raise ToolRefused("validation_failed", "IS_A_DIRECTORY", f"{where.canonical!r} is a directory", path=where.canonical) from None
    except OSError as exc:
        raise ToolRefused("validation_failed", "IO_ERROR", f"cannot open {where.canonical!r}: {exc.strerror}",
                               path=where.canonical) from None
    try:
        if os.path.isdir(where.real):
            raise ToolRefused("validation_failed", "IS_A_DIRECTORY", f"{where.canonical!r} is a directory", path=where.canonical)
        size = os.fstat(fd).st_size
        if size > MAX_FILE_BYTES:
            raise ToolRefused("validation_failed", "FILE_TOO_LARGE", f"{where.canonical!r} is {size} bytes; at most {MAX_FILE_BYTES}")
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- seed ----------------------------------------------------------------------

_MERCHANT = {"acme": "MER-ACME-7781", "globex": "MER-GLOBEX-2207"}


def seed_files(tenant: str) -> dict[str, str]:
    """The files a new workspace starts with. ``payments/config.json`` names
    the tenant, so a test can tell whose workspace a result came from."""
    config = {
        "tenant": tenant,
        "merchant_id": _MERCHANT.get(tenant, f"MER-{tenant.upper()}-0001"),
        "provider": "cardpay",
        "currency": "USD",
        "refund_window_days": 30,
        "api_key_ref": f"vault://{tenant}/payments/provider",
    }
    files = dict(SEED_FILES)
    files["payments/config.json"] = json.dumps(config, indent=2, sort_keys=True) + "\n"
    return files


SEED_FILES: dict[str, str] = {
    "README.md": """\
# Order service

`src/` holds the order and refund logic, `tests/` its tests, and
`payments/provider/` the client for the card payment provider.
""",
    "src/__init__.py": '"""Order service."""\n',
    "src/orders.py": '''\
"""Orders as the service stores them; amounts in cents."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Order:
    order_id: str
    amount_cents: int
    refunded_cents: int = 0
    status: str = "paid"

    @property
    def refundable_cents(self) -> int:
        return self.amount_cents - self.refunded_cents
''',
    "src/refunds.py": '''\
"""Refund planning: never more than what is left on the order."""

from __future__ import annotations

from .orders import Order


class RefundTooLarge(ValueError):
    pass


def plan_refund(order: Order, amount_cents: int) -> Order:
    if amount_cents <= 0:
        raise ValueError("a refund is a positive amount")
    if amount_cents > order.refundable_cents:
        raise RefundTooLarge(f"{order.order_id}: {amount_cents} > {order.refundable_cents}")
    refunded = order.refunded_cents + amount_cents
    status = "refunded" if refunded == order.amount_cents else "partially_refunded"
    return Order(order.order_id, order.amount_cents, refunded, status)
''',
    "tests/test_orders.py": '''\
from src.orders import Order


def test_refundable_is_what_is_left():
    assert Order("ORD-1", 2500, 1000).refundable_cents == 1500
''',
    "tests/test_refunds.py": '''\
import pytest

from src.orders import Order
from src.refunds import RefundTooLarge, plan_refund


def test_full_refund_marks_order_refunded():
    assert plan_refund(Order("ORD-1", 2500), 2500).status == "refunded"


def test_refund_cannot_exceed_what_is_left():
    with pytest.raises(RefundTooLarge):
        plan_refund(Order("ORD-1", 2500, 2000), 1000)
''',
    "payments/provider/__init__.py": '"""Client of the card payment provider."""\n',
    "payments/provider/client.py": '''\
"""Thin client of the provider's refund API.

The provider does not deduplicate refunds: sending the same request twice
refunds twice. Callers must reconcile by idempotency key before re-sending.
"""

from __future__ import annotations

import json
from pathlib import Path


class ProviderClient:
    def __init__(self, config_path: Path) -> None:
        self.config = json.loads(config_path.read_text())

    def refund(self, order_id: str, amount_cents: int, idempotency_key: str) -> dict:
        return {"order_id": order_id, "amount_cents": amount_cents, "key": idempotency_key,
                "merchant": self.config["merchant_id"]}
''',
}
