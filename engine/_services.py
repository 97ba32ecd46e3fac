"""The systems behind the demo tools: an order service, a payment provider,
a deploy API and a report warehouse, all in ``demo_backend.sqlite``.

Each function works inside the caller's transaction and returns the plain
result of the tool, or raises :class:`~._workspace.ToolRefused`; turning
that into a ``ToolOutcome`` (and recording the execution) is the backend's
job, so every tool shares one path for faults and idempotency.

Money is kept in integer cents: a refund of 0.1 + 0.2 must not leave a
fraction of a cent behind.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loopledger.canonical import canonical_json, loads

from ._workspace import ToolRefused, printable

if TYPE_CHECKING:
    from ._backends import ToolRequest

__all__ = ["SCHEMA_VERSION", "create_schema"]

#: Bumped with a numbered step in :func:`create_schema` when the tables change.
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE orders (
    world TEXT NOT NULL, order_id TEXT NOT NULL, tenant TEXT NOT NULL, status TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, refunded_cents INTEGER NOT NULL, currency TEXT NOT NULL,
    version INTEGER NOT NULL, address_json TEXT NOT NULL, updated_at INTEGER NOT NULL,
    PRIMARY KEY (world, order_id)
);
CREATE TABLE refunds (
    refund_id INTEGER PRIMARY KEY, order_id TEXT NOT NULL, tenant TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, idempotency_key TEXT NOT NULL, run_id TEXT NOT NULL, created_at INTEGER NOT NULL
);
CREATE TABLE deployments (
    deploy_id INTEGER PRIMARY KEY, world TEXT NOT NULL, tenant TEXT NOT NULL, service TEXT NOT NULL, version TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, deployed_at INTEGER NOT NULL
);
CREATE TABLE executions (
    execution_id INTEGER PRIMARY KEY,
    tool TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    execution_no INTEGER NOT NULL,        -- 1 for the key's first execution, 2 means it ran twice
    honours_key INTEGER NOT NULL,         -- the provider deduplicates this tool by key
    run_id TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    call_number INTEGER NOT NULL,
    args_hash TEXT NOT NULL,              -- content_id of the canonical arguments
    executed_at INTEGER NOT NULL,         -- microseconds since the epoch (engine clock)
    outcome_json TEXT NOT NULL,           -- the ToolOutcome returned, as canonical JSON
    result_json TEXT NOT NULL,
    UNIQUE (idempotency_key, execution_no)
);
CREATE UNIQUE INDEX executions_one_per_key ON executions (idempotency_key) WHERE honours_key = 1;
CREATE INDEX executions_by_run ON executions (run_id, tool);
CREATE TABLE deliveries (
    delivery_id INTEGER PRIMARY KEY, idempotency_key TEXT NOT NULL, tool TEXT NOT NULL, run_id TEXT NOT NULL,
    operation_id TEXT NOT NULL, call_number INTEGER NOT NULL, received_at INTEGER NOT NULL,
    fault TEXT, executed INTEGER NOT NULL, deduplicated INTEGER NOT NULL, outcome TEXT NOT NULL
);
CREATE INDEX deliveries_by_key ON deliveries (idempotency_key);
CREATE TABLE fault_firings (
    run_id TEXT NOT NULL, tool TEXT NOT NULL, call_number INTEGER NOT NULL, kind TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, fired_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, tool, call_number)
);
CREATE TABLE work (
    work_id TEXT PRIMARY KEY, idempotency_key TEXT NOT NULL, run_id TEXT NOT NULL, tenant TEXT NOT NULL,
    tool TEXT NOT NULL, query TEXT NOT NULL, accepted_at INTEGER NOT NULL, due_at INTEGER NOT NULL,
    will_fail INTEGER NOT NULL, state TEXT NOT NULL, cancel_requested_at INTEGER,
    finished_at INTEGER, outcome_json TEXT
);
"""


def _statements(script: str) -> Iterator[str]:
    # executescript() would commit the open transaction; split instead, on
    # whole statements only (a `;` inside a comment does not end one).
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""


_CITIES = ("Springfield", "Riverton", "Lakeside", "Fairview", "Greenville")


def seed_orders() -> list[tuple[Any, ...]]:
    """ORD-1001..ORD-1050 for acme, ORD-2001..ORD-2010 for globex: paid,
    25.00 USD, version 1, a deterministic address each."""
    rows = []
    for tenant, first, count in (("acme", 1001, 50), ("globex", 2001, 10)):
        for n in range(first, first + count):
            address = {"street": f"{n % 97 + 1} Market Street", "city": _CITIES[n % len(_CITIES)],
                       "zip": f"{10000 + n * 7 % 89999:05d}", "country": "US"}
            rows.append((f"ORD-{n}", tenant, "paid", 2500, 0, "USD", 1, canonical_json(address)))
    return rows


def create_schema(conn: sqlite3.Connection, now: int, path: object) -> None:
    """Create and seed the tables unless they exist; inside the caller's
    write transaction, so two processes opening a fresh home do it once."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        from ._backends import BackendUnavailable

        raise BackendUnavailable(f"{path}: schema version {version}; this loopledger reads up to {SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:
        for statement in _statements(SCHEMA):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    # The backend's identity, made once (a home made before it existed gets
    # one too): runs record the backend they act on (see DemoBackend.identity).
    conn.execute("CREATE TABLE IF NOT EXISTS backend_identity (backend_id TEXT NOT NULL)")
    if conn.execute("SELECT 1 FROM backend_identity").fetchone() is None:
        conn.execute("INSERT INTO backend_identity (backend_id) VALUES (?)", (secrets.token_hex(8),))
    # Per run, the highest claim number a request came with: a request with
    # a lower one comes from a driver that lost the run (see DemoBackend.execute).
    conn.execute("CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL)")


def backend_identity(conn: sqlite3.Connection) -> str:
    return str(conn.execute("SELECT backend_id FROM backend_identity").fetchone()[0])


def ensure_world(conn: sqlite3.Connection, world: str, now: int) -> None:
    """Seed a run's own copy of the orders on its first call.

    Every run acts in a world of its own (its orders, its workspace), so a
    scenario's outcome never depends on what other runs in the same data
    directory did before it, or beside it under ``--concurrency``."""
    if conn.execute("SELECT 1 FROM orders WHERE world = ? LIMIT 1", (world,)).fetchone() is None:
        conn.executemany(
            "INSERT INTO orders (world, order_id, tenant, status, amount_cents, refunded_cents, currency, version,"
            " address_json, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(world, *row, now) for row in seed_orders()],
        )


def money(cents: int) -> float:
    return cents / 100


def check_version(req: ToolRequest, current: str, subject: str) -> None:
    """STATE_CONFLICT when the request was planned against another version."""
    if req.expected_resource_version is not None and req.expected_resource_version != current:
        raise ToolRefused("validation_failed", "STATE_CONFLICT",
                          f"{subject} is at version {current}, not {req.expected_resource_version}",
                          current_version=current, expected_version=req.expected_resource_version)


# --- orders and payments ------------------------------------------------------------------


def find_order(conn: sqlite3.Connection, req: ToolRequest) -> sqlite3.Row:
    order_id = req.arguments["order_id"]
    row = conn.execute("SELECT * FROM orders WHERE world = ? AND order_id = ?", (req.run_id, order_id)).fetchone()
    if row is None:
        raise ToolRefused("validation_failed", "NOT_FOUND", f"no order {order_id}", order_id=order_id)
    if row["tenant"] != req.tenant:
        # Nothing about the order: not its status, not its amount.
        raise ToolRefused("permission_denied", "PERMISSION_DENIED",
                          f"order {order_id} is not accessible to tenant {printable(req.tenant)}", order_id=order_id)
    check_version(req, str(row["version"]), order_id)
    return row


def order_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "order_id": row["order_id"], "status": row["status"], "amount": money(row["amount_cents"]),
        "refunded": money(row["refunded_cents"]), "currency": row["currency"], "version": row["version"],
        "address": loads(row["address_json"]),
    }


def order_version(conn: sqlite3.Connection, world: str, order_id: Any, tenant: str) -> int | None:
    """The order's version if the tenant may see it (for a STATE_CONFLICT reply)."""
    if not isinstance(order_id, str):
        return None
    row = conn.execute("SELECT tenant, version FROM orders WHERE world = ? AND order_id = ?",
                       (world, order_id)).fetchone()
    return row["version"] if row is not None and row["tenant"] == tenant else None


def update_address(conn: sqlite3.Connection, req: ToolRequest, now: int) -> dict[str, Any]:
    order = find_order(conn, req)
    expected = req.arguments["expected_version"]
    if expected != order["version"]:
        raise ToolRefused("validation_failed", "STATE_CONFLICT",
                          f"{order['order_id']} is at version {order['version']}, not {expected}; get it again",
                          order_id=order["order_id"], current_version=order["version"], expected_version=expected)
    version = order["version"] + 1
    conn.execute("UPDATE orders SET address_json = ?, version = ?, updated_at = ? WHERE world = ? AND order_id = ?",
                 (canonical_json(req.arguments["address"]), version, now, req.run_id, order["order_id"]))
    return {"order_id": order["order_id"], "version": version, "address": req.arguments["address"]}


def _number_in_world(conn: sqlite3.Connection, req: ToolRequest) -> int:
    """This execution's number among the run's executions of the tool (its
    world's), counting this one: a refund or deploy id that does not depend
    on what other runs did. Executions are recorded after the tool returns."""
    (done,) = conn.execute("SELECT count(*) FROM executions WHERE run_id = ? AND tool = ?",
                           (req.run_id, req.tool)).fetchone()
    return done + 1


def refund(conn: sqlite3.Connection, req: ToolRequest, now: int) -> dict[str, Any]:
    """Refund part or all of what is left on the order. The provider checks
    the balance but not the idempotency key (see ToolTraits)."""
    order = find_order(conn, req)
    amount = req.arguments["amount"]
    cents = round(amount * 100)
    if abs(amount * 100 - cents) > 1e-6:
        raise ToolRefused("validation_failed", "INVALID_ARGUMENT", f"amount {amount} has more than two decimals")
    remaining = order["amount_cents"] - order["refunded_cents"]
    if cents > remaining:
        raise ToolRefused("validation_failed", "AMOUNT_EXCEEDS_REMAINING",
                          f"refund of {money(cents):.2f} exceeds the {money(remaining):.2f} left on {order['order_id']}",
                          order_id=order["order_id"], remaining=money(remaining))
    refunded = order["refunded_cents"] + cents
    status = "refunded" if refunded == order["amount_cents"] else "partially_refunded"
    conn.execute(
        "INSERT INTO refunds (order_id, tenant, amount_cents, idempotency_key, run_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (order["order_id"], req.tenant, cents, req.idempotency_key, req.run_id, now))
    refund_id = _number_in_world(conn, req)
    # A refund changes the order, so it bumps the version: an address update
    # planned before it is now stale.
    conn.execute("UPDATE orders SET refunded_cents = ?, status = ?, version = version + 1, updated_at = ?"
                 " WHERE world = ? AND order_id = ?", (refunded, status, now, req.run_id, order["order_id"]))
    return {"refund_id": f"RF-{refund_id:06d}", "order_id": order["order_id"], "amount": money(cents),
            "refunded_total": money(refunded), "remaining": money(order["amount_cents"] - refunded),
            "order_status": status}


# --- deploys and reports ----------------------------------------------------------------------


def deploy(conn: sqlite3.Connection, req: ToolRequest, now: int) -> dict[str, Any]:
    service, version = req.arguments["service"], req.arguments["version"]
    previous = conn.execute("SELECT version FROM deployments WHERE world = ? AND tenant = ? AND service = ?"
                            " ORDER BY deploy_id DESC LIMIT 1", (req.run_id, req.tenant, service)).fetchone()
    conn.execute(
        "INSERT INTO deployments (world, tenant, service, version, idempotency_key, deployed_at)"
        " VALUES (?, ?, ?, ?, ?, ?)", (req.run_id, req.tenant, service, version, req.idempotency_key, now))
    deploy_id = _number_in_world(conn, req)
    return {"deploy_id": f"DEP-{deploy_id:06d}", "service": service, "version": version, "status": "deployed",
            "previous_version": previous["version"] if previous else None}


_STATUSES = ("partially_refunded", "refunded", "paid")


def report(conn: sqlite3.Connection, world: str, tenant: str, query: str) -> dict[str, Any]:
    """The tenant's orders as CSV; a status named in the query filters them.
    Only the tenant's own rows can be in it: the query text never reaches SQL."""
    status = next((s for s in _STATUSES if s in query.lower()), None)
    sql = "SELECT order_id, status, amount_cents, refunded_cents FROM orders WHERE world = ? AND tenant = ?"
    params: list[Any] = [world, tenant]
    if status:
        sql += " AND status = ?"
        params.append(status)
    rows = conn.execute(sql + " ORDER BY order_id", params).fetchall()
    lines = ["order_id,status,amount,refunded"]
    lines += [f"{r['order_id']},{r['status']},{money(r['amount_cents']):.2f},{money(r['refunded_cents']):.2f}"
              for r in rows]
    return {"query": query, "status_filter": status, "rows": len(rows), "csv": "\n".join(lines) + "\n"}
