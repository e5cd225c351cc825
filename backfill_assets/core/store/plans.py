"""Plans as the control store keeps them: found by id or by a unique prefix."""

from __future__ import annotations

import re

import psycopg
from pydantic import ValidationError

from backfill_assets.core.errors import ApprovalError, PlanReferenceError
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan

MIN_PREFIX = 8


def find_plan(conn: psycopg.Connection, spec: Spec, plan_ref: str) -> Plan:
    """The stored plan with this id, or the only one starting with this prefix.

    Raises:
        PlanReferenceError: ``plan_ref`` is not 8 to 64 hex digits (a bad argument).
        ApprovalError: no such plan, an ambiguous prefix, or a plan of another spec.
    """
    ref = plan_ref.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{%d,64}" % MIN_PREFIX, ref):
        raise PlanReferenceError(plan_ref, MIN_PREFIX)
    if not store.control_ready(conn, spec.control_schema):
        raise ApprovalError(f"no plans exist in schema {spec.control_schema}; run plan first")
    found = store.plans_by_prefix(conn, spec.control_schema, ref)
    if not found:
        raise ApprovalError(f"there is no plan {ref}; run plan and use the plan_id it prints")
    if len(found) > 1:
        raise ApprovalError(f"plan prefix {ref} is ambiguous; give more of the plan id")
    plan_id, _, stored = found[0]
    try:
        plan = Plan.from_json(stored)
    except ValidationError as err:
        raise ApprovalError(
            f"plan {plan_id[:16]} was stored in a form this version cannot read "
            f"({err.error_count()} problem(s)); plan again", plan_id=plan_id,
        ) from None
    except ValueError as err:  # edited since it was stored
        raise ApprovalError(f"{err}; it was changed after it was made: plan again", plan_id=plan_id) from None
    made_with = plan.document.fingerprint_format
    if made_with != FINGERPRINT_FORMAT:
        raise ApprovalError(
            f"plan {plan_id[:16]} was made with fingerprint format {made_with or 'older than 3'}; this version "
            f"computes format {FINGERPRINT_FORMAT}, so its readings cannot be checked against it: plan again",
            plan_id=plan_id,
        )
    if plan.document.spec != spec.name:
        raise ApprovalError(f"plan {plan_id[:16]} belongs to spec {plan.document.spec}, not {spec.name}",
                            plan_id=plan_id)
    return plan
