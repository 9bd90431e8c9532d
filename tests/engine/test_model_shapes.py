"""Model-based test of policy shapes (docs/preemption.md, "Policy shapes"): time windows on a
moving clock, preemption groups, priority lanes and pattern policies (team quotas).

A Hypothesis ``RuleBasedStateMachine`` drives one pool through creates (single requests and
two-member gangs, with or without a preemption group, preemptible or not), releases, cancels,
terminates, clock moves and reconciler passes, every call with the machine's clock as
``p_now``. It does not predict every status (tests/engine/test_model.py does that for the plain
rules); it checks what the shapes promise, after every step:

* I1-I4: ``respool.invariant_violations`` is empty;
* a request's policy is its subject's exact policy, else the matching pattern with the longest
  literal prefix (the Python reference below);
* no request ever preempted (reason reclaim or priority) an allocation of its own preemption
  group;
* no lane allocation was ever preempted (reclaim or priority) for a request of another lane
  policy, and none by priority for a non-lane request;
* right after a pass at time t, a policy with windows is active exactly when t is inside one of
  its windows (the Python reference below, with zoneinfo), its share in force (``reserved``) is
  the share as set while active and 0 outside, ``next_change`` is the next instant that flips
  ``active``; a policy without windows is always active with its whole share in force.

The clock starts at a half minute and moves by whole minutes, so no check falls on a window
boundary (boundaries are whole minutes). ``RESPOOL_MODEL_TWIN=<twin in support.twins>``
installs a known-bad engine first: ``broken_group_twin`` (victims chosen regardless of
preemption groups) must make it fail; ``test_the_group_check_catches_the_broken_twin`` proves the
same deterministically in every run.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    rule,
)

from support.model import DatabaseMachine, model_sizes, run_machine
from support.twins import install_twin

# A Monday, half a minute past midnight UTC; 40 steps of at most a day stay in January-February
# (no daylight-saving change in any zone below).
CLOCK0 = datetime(2030, 1, 7, 0, 0, 30, tzinfo=UTC)
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata")
# Subjects of requests: exact policies, a lane pair, and a team under two patterns.
SUBJECTS = (
    "prod", "research", "oncall", "pager", "team:a", "team:b", "team:x", "team:x:1", "team:x:2",
)  # fmt: skip
GROUPS = (None, "g1", "g1", "g2")
MINUTE = timedelta(minutes=1)


# --- references --------------------------------------------------------------------------------


def policy_for(subject: str, policies: dict[str, str]) -> str | None:
    """The policy subject a request of ``subject`` goes through: its exact policy, else the
    matching pattern with the longest literal prefix (the text before the first ``*``)."""
    if subject in policies and "*" not in subject:
        return subject
    best: tuple[int, str] | None = None
    for pattern in policies:
        if "*" not in pattern:
            continue
        regex = "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"
        if re.match(regex, subject):
            prefix = len(pattern.split("*", 1)[0])
            if best is None or prefix > best[0]:
                best = (prefix, pattern)
    return best[1] if best else None


def _hhmm(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def inside(windows: list[dict[str, Any]] | None, at: datetime) -> bool:
    """Whether ``at`` is inside one of ``windows`` (None: always). Weekly windows are half-open
    [from, to) in their zone on the days they start; ``to`` before ``from`` crosses midnight and
    ``from`` = ``to`` lasts 24 hours. One-time windows are [start, end)."""
    if windows is None:
        return True
    for w in windows:
        if "start" in w:
            if datetime.fromisoformat(w["start"]) <= at < datetime.fromisoformat(w["end"]):
                return True
            continue
        local = at.astimezone(ZoneInfo(w.get("timezone") or "UTC"))
        days = set(w.get("days") or DAYS)
        minute = local.hour * 60 + local.minute
        today, yesterday = DAYS[local.weekday()], DAYS[(local.weekday() - 1) % 7]
        start, end = _hhmm(w["from"]), _hhmm(w["to"])
        if start < end:
            if today in days and start <= minute < end:
                return True
        elif (today in days and minute >= start) or (yesterday in days and minute < end):
            return True
    return False


@st.composite
def window_st(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 4)) == 0:
        start = CLOCK0 - timedelta(seconds=30) + draw(st.integers(0, 3 * 24 * 60)) * MINUTE
        end = start + draw(st.integers(1, 2 * 24 * 60)) * MINUTE
        return {"start": start.isoformat(), "end": end.isoformat()}
    w: dict[str, Any] = {"timezone": draw(st.sampled_from(ZONES))}
    if draw(st.booleans()):
        w["days"] = sorted(draw(st.sets(st.sampled_from(DAYS), min_size=1)), key=DAYS.index)
    begin = draw(st.integers(0, 23 * 4)) * 15  # minutes after midnight, local
    length = draw(st.sampled_from([60, 240, 600, 720, 23 * 60, 24 * 60]))
    w["from"] = f"{begin // 60:02d}:{begin % 60:02d}"
    finish = (begin + length) % (24 * 60)
    w["to"] = f"{finish // 60:02d}:{finish % 60:02d}"
    return w


windows_st = st.one_of(st.none(), st.lists(window_st(), min_size=1, max_size=3))


# --- the checks (shared with the deterministic twin test) --------------------------------------

_PREEMPTIONS_SQL = """
SELECT v.id AS victim, v.pool_id AS victim_pool, v.preemption_group AS victim_group,
       vp.subject AS victim_policy, vp.priority_lane AS victim_lane, e.reason, e.message,
       e.cause_request_id
  FROM respool.events e
  JOIN respool.requests v ON v.id = e.request_id
  JOIN respool.policies vp ON vp.id = v.policy_id
 WHERE e.reason IN ('reclaim', 'priority') AND e.to_status IN ('preempting', 'preempted')
"""


async def preemption_breaches(conn: asyncpg.Connection) -> list[str]:
    """Every reclaim or priority preemption so far that took an allocation of the requester's
    own preemption group, or lane work the lane rules protect."""
    out = []
    for e in await conn.fetch(_PREEMPTIONS_SQL):
        found = e["cause_request_id"]
        assert found, f"a preemption records no requester: {e['message']!r}"
        # The requester's policy: held, or queued; a requester that left the queue since
        # (cancelled, terminated) keeps neither, so its subject's policy in the victim's pool
        # (the policies never change during a run).
        r = await conn.fetchrow(
            "SELECT r.preemption_group, p.subject, p.priority_lane FROM respool.requests r"
            " JOIN respool.policies p ON p.id = coalesce(r.policy_id,"
            "   (SELECT q.policy_id FROM respool.queue_entries q WHERE q.request_id = r.id"
            "     LIMIT 1), respool._policy_for(r.subject, $2))"
            " WHERE r.id = $1",
            found,
            e["victim_pool"],
        )
        assert r is not None, f"requester {found} has no policy"
        what = f"{e['reason']}: {r['subject']} took {e['victim']} of {e['victim_policy']}"
        if r["preemption_group"] is not None and r["preemption_group"] == e["victim_group"]:
            out.append(f"{what}, both in group {r['preemption_group']}")
        if e["victim_lane"] and r["priority_lane"] and r["subject"] != e["victim_policy"]:
            out.append(f"{what}, a lane allocation for another lane")
        if e["victim_lane"] and not r["priority_lane"] and e["reason"] == "priority":
            out.append(f"{what}, lane work by priority for a non-lane request")
    return out


_WINDOWS_SQL = """
SELECT p.subject, p.windows, p.active, p.next_change,
       coalesce(jsonb_object_agg(pr.key, jsonb_build_array(pr.reserved, pr.configured))
                FILTER (WHERE pr.key IS NOT NULL), '{}') AS shares
  FROM respool.policies p LEFT JOIN respool.policy_resources pr ON pr.policy_id = p.id
 GROUP BY p.id
"""


async def window_breaches(conn: asyncpg.Connection, at: datetime) -> list[str]:
    """Right after a pass at ``at``: every policy whose active flag, share in force or next
    change disagrees with its windows."""
    out = []
    for p in await conn.fetch(_WINDOWS_SQL):
        want = inside(p["windows"], at)
        if p["active"] != want:
            out.append(f"{p['subject']}: active {p['active']} at {at}, windows say {want}")
        for key, (in_force, as_set) in p["shares"].items():
            if in_force != (as_set if want else 0):
                out.append(f"{p['subject']}/{key}: share in force {in_force}, as set {as_set}")
        nxt = p["next_change"]
        if p["windows"] is None:
            if nxt is not None:
                out.append(f"{p['subject']}: no windows but next_change {nxt}")
        elif nxt is not None:
            # A flip at nxt (a whole minute), none in the half minute before it.
            if nxt <= at or inside(p["windows"], nxt) == want:
                out.append(f"{p['subject']}: next_change {nxt} does not flip active at {at}")
            elif inside(p["windows"], nxt - timedelta(seconds=30)) != want:
                out.append(f"{p['subject']}: active flips before next_change {nxt}")
    return out


# --- the machine -------------------------------------------------------------------------------


async def make_policy(
    conn: asyncpg.Connection,
    subject: str,
    priority: int,
    reserved: int,
    limit: int | None,
    lane: bool,
    windows: list[dict[str, Any]] | None,
    now: datetime,
) -> str:
    """A policy of pool ``gp`` with a gpu share and limit; returns its id."""
    doc = await conn.fetchval(
        "SELECT respool.create_policy(p_subject => $1, p_pool => 'gp', p_priority => $2,"
        " p_reserved => $3, p_limit => $4, p_now => $5, p_priority_lane => $6, p_windows => $7)",
        subject,
        priority,
        {"gpu": reserved} if reserved else {},
        {"gpu": limit} if limit else {},
        now,
        lane,
        windows,
    )
    return str(doc["id"])


class ShapesMachine(DatabaseMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = CLOCK0
        self.policies: dict[str, str] = {}  # policy subject -> id
        self.requests: dict[str, tuple[str, str | None]] = {}  # id -> (subject, group)

    @initialize(
        gpu=st.sampled_from([8, 8, 10]),
        grace=st.sampled_from([0, 0, 120]),
        queueing=st.sampled_from(["best_effort", "best_effort", "strict"]),
        priorities=st.lists(st.integers(0, 3), min_size=6, max_size=6),
        shares=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2)),
        windows=st.tuples(windows_st, windows_st, windows_st),
        team_limit=st.sampled_from([None, 4, 6]),
    )
    def setup(
        self,
        gpu: int,
        grace: int,
        queueing: str,
        priorities: list[int],
        shares: tuple[int, int, int],
        windows: tuple[Any, Any, Any],
        team_limit: int | None,
    ) -> None:
        self.wipe()
        self.sql(
            "SELECT respool.create_pool(p_name => 'gp', p_capacity => $1, p_queueing => $2,"
            " p_preemption_grace_seconds => $3, p_now => $4)",
            {"gpu": gpu},
            queueing,
            grace,
            self.now,
        )
        prod, research, team = shares
        # (subject, priority, reserved gpu, limit gpu, lane, windows). The shares as set add up
        # to at most 8 <= capacity, so no window layout can be refused.
        plan = [
            ("prod", priorities[0], prod, None, False, windows[0]),
            ("research", priorities[1], research, None, False, windows[1]),
            ("oncall", priorities[2], 0, None, True, None),
            ("pager", priorities[3], 0, None, True, None),
            ("team:*", priorities[4], team, team_limit, False, windows[2]),
            ("team:x:*", priorities[5], 0, None, False, None),
        ]
        for subject, priority, reserved, limit, lane, wins in plan:
            self.policies[subject] = self.runner.run(
                make_policy(self.conn, subject, priority, reserved, limit, lane, wins, self.now)
            )
        self.stats["windowed_policies"] += sum(w is not None for w in windows)
        self._pass()

    # rules -------------------------------------------------------------------------------------

    @rule(
        subject=st.sampled_from(SUBJECTS),
        gpu=st.sampled_from([1, 1, 2, 2, 3, 4]),
        preemptible=st.sampled_from([True, True, True, False]),
        group=st.sampled_from(GROUPS),
    )
    def create(self, subject: str, gpu: int, preemptible: bool, group: str | None) -> None:
        self._create(subject, gpu, preemptible, group)

    @rule(
        subjects=st.lists(st.sampled_from(SUBJECTS), min_size=2, max_size=4),
        group=st.sampled_from(GROUPS),
    )
    def fill(self, subjects: list[str], group: str | None) -> None:
        """A burst of preemptible 2-GPU requests: borrowers to preempt, and requests that wait."""
        for subject in subjects:
            self._create(subject, 2, True, group)

    def _create(self, subject: str, gpu: int, preemptible: bool, group: str | None) -> None:
        made = self.sql(
            "SELECT (respool.create_request($1, p_now => $2)).request",
            {
                "subject": subject,
                "pool": "gp",
                "resources": {"gpu": gpu},
                "preemptible": preemptible,
                "preemption_group": group,
                "lease_seconds": None,
            },
            self._call_time(),
        )
        self.requests[made["id"]] = (subject, group)
        self.stats[f"created_{made['status']}"] += 1

    @rule(
        subject=st.sampled_from(SUBJECTS),
        gpu=st.sampled_from([1, 2]),
        group=st.sampled_from(GROUPS),
    )
    def create_gang(self, subject: str, gpu: int, group: str | None) -> None:
        """Two members, one group: a gang is one victim unit and one requester."""
        member = {
            "subject": subject,
            "pool": "gp",
            "resources": {"gpu": gpu},
            "preemption_group": group,
            "lease_seconds": None,
        }
        rows = self.fetch(
            "SELECT created, request FROM respool.create_requests($1, p_all_or_nothing => true,"
            " p_now => $2)",
            [member, member],
            self._call_time(),
        )
        for row in rows:
            self.requests[row["request"]["id"]] = (subject, group)
        self.stats["gangs"] += 1

    def _pick(self, data: st.DataObject, statuses: tuple[str, ...]) -> str | None:
        """One of the requests in ``statuses``, in creation order (the order of self.requests).
        The draw is an index in a fixed range, taken modulo how many there are: what Hypothesis
        draws must not depend on the database's answer (a replay that found one request more or
        less would stop the run as "inconsistent data generation" instead of checking it)."""
        now_in = {
            r["id"]
            for r in self.fetch(
                "SELECT id::text FROM respool.requests WHERE status = ANY($1::text[])",
                list(statuses),
            )
        }
        live = [rid for rid in self.requests if rid in now_in]
        return live[data.draw(st.integers(0, 255)) % len(live)] if live else None

    def _call_time(self) -> datetime:
        """The clock for the next call: 10 ms later than the last one, so no two calls share an
        instant (ties in victim order would fall to random ids) and the clock stays half a
        minute off every window boundary."""
        self.now += timedelta(milliseconds=10)
        return self.now

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if rid := self._pick(data, ("allocated", "preempting")):
            self.sql(
                "SELECT respool.release_request(p_id => $1, p_now => $2)", rid, self._call_time()
            )
            self.stats["released"] += 1

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if rid := self._pick(data, ("queued",)):
            self.sql(
                "SELECT respool.cancel_request(p_id => $1, p_now => $2)", rid, self._call_time()
            )

    @rule(data=st.data(), force=st.booleans())
    def terminate(self, data: st.DataObject, force: bool) -> None:
        """An admin ends a request: never requeued, never a group's or a lane's concern."""
        if rid := self._pick(data, ("queued", "allocated", "preempting")):
            try:
                self.sql(
                    "SELECT respool.terminate_request(p_id => $1, p_force => $2, p_now => $3)",
                    rid,
                    force,
                    self._call_time(),
                )
                self.stats["terminated"] += 1
            except asyncpg.PostgresError as exc:
                assert not force and "not preemptible" in str(exc), exc

    @rule(minutes=st.sampled_from([1, 7, 45, 90, 240, 600, 1440]))
    def tick(self, minutes: int) -> None:
        """The clock moves; nothing happens until the next pass (or the next call)."""
        self.now += minutes * MINUTE

    @rule(minutes=st.sampled_from([0, 1, 30, 180, 720]))
    def reconcile(self, minutes: int) -> None:
        self.now += minutes * MINUTE
        self._pass()

    @rule()
    def reconcile_now(self) -> None:
        self._pass()

    def _pass(self) -> None:
        """A reconciler pass at the machine's clock: it applies the window boundaries due first,
        then preempts and grants."""
        self._call_time()
        assert self.sql(
            "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = 'gp'), $1)",
            self.now,
        ), "the pass skipped the pool"
        self.stats["passes"] += 1
        breaches = self.runner.run(window_breaches(self.conn, self.now))
        assert breaches == [], "\n".join(breaches)
        self.stats["passes_with_a_closed_window"] += bool(
            self.sql("SELECT count(*) FROM respool.policies WHERE NOT active")
        )

    # checks ------------------------------------------------------------------------------------

    def teardown(self) -> None:
        for reason, n in self.fetch(
            "SELECT reason, count(*) FROM respool.events WHERE to_status IN ('preempting',"
            " 'preempted') AND from_status <> 'preempting' GROUP BY reason"
        ):
            self.stats[f"preempted_{reason}"] += n
        self.stats["grouped_preemptions"] += self.sql(
            "SELECT count(*) FROM respool.events e JOIN respool.requests r ON r.id = e.request_id"
            " WHERE e.reason IN ('reclaim', 'priority') AND r.preemption_group IS NOT NULL"
        )

    @invariant()
    def shapes_hold(self) -> None:
        if not self.policies:
            return
        self.stats["checks"] += 1
        assert self.fetch("SELECT * FROM respool.invariant_violations") == []
        breaches = self.runner.run(preemption_breaches(self.conn))
        assert breaches == [], "\n".join(breaches)
        by_id = {v: k for k, v in self.policies.items()}
        for row in self.fetch(
            # A queued gang waits as one entry, its first member's: the others go through it.
            "SELECT r.id::text, coalesce(r.policy_id, q.policy_id, (SELECT g.policy_id"
            "         FROM respool.queue_entries g JOIN respool.requests m ON m.id = g.request_id"
            "        WHERE m.gang_id = r.gang_id LIMIT 1))::text AS policy_id, r.status"
            "  FROM respool.requests r LEFT JOIN respool.queue_entries q ON q.request_id = r.id"
            " WHERE r.status IN ('queued', 'allocated', 'preempting')"
        ):
            subject, _ = self.requests[row["id"]]
            want = policy_for(subject, self.policies)
            assert by_id.get(row["policy_id"]) == want, (
                f"{subject} ({row['status']}) went through {by_id.get(row['policy_id'])},"
                f" not {want}"
            )


@model_sizes(quick=(15, 25))
def test_policy_shapes_hold_on_a_moving_clock(db_url: str, examples: int, steps: int) -> None:
    run_machine(ShapesMachine, db_url, examples, steps, "shapes model")
    # The rules were exercised, not just the empty cases.
    assert ShapesMachine.stats["passes_with_a_closed_window"] > 0
    assert ShapesMachine.stats["grouped_preemptions"] > 0 or examples < 50


# --- references, and the checks against a known-bad engine -------------------------------------


def test_policy_resolution_reference() -> None:
    policies = {"team:*": "1", "team:x:*": "2", "prod": "3", "*:gpu": "4"}
    assert policy_for("prod", policies) == "prod"
    assert policy_for("team:a", policies) == "team:*"
    assert policy_for("team:x", policies) == "team:*"  # "team:x:" is not a prefix of it
    assert policy_for("team:x:1", policies) == "team:x:*"
    assert policy_for("team:gpu", policies) == "team:*"  # the longer literal prefix wins
    assert policy_for("ops:gpu", policies) == "*:gpu"
    assert policy_for("ops", policies) is None


def test_window_reference() -> None:
    berlin = {"timezone": "Europe/Berlin", "days": ["fri"], "from": "22:00", "to": "06:00"}
    fri = datetime(2030, 1, 11, 21, 30, tzinfo=UTC)  # Friday 22:30 in Berlin (UTC+1)
    assert inside([berlin], fri)
    assert inside([berlin], fri + timedelta(hours=7))  # Saturday 05:30: started on Friday
    assert not inside([berlin], fri + timedelta(hours=8))  # Saturday 06:30
    assert not inside([berlin], fri - timedelta(days=1))  # Thursday 22:30
    day = {"timezone": "UTC", "from": "08:00", "to": "08:00"}  # 24 hours from 08:00
    assert inside([day], datetime(2030, 1, 7, 7, 59, 30, tzinfo=UTC))
    once = {"start": "2030-01-07T10:00:00+00:00", "end": "2030-01-07T11:00:00+00:00"}
    assert inside([once], datetime(2030, 1, 7, 10, 59, 30, tzinfo=UTC))
    assert not inside([once], datetime(2030, 1, 7, 11, 0, 30, tzinfo=UTC))
    assert inside(None, fri)


async def test_the_group_check_catches_the_broken_twin(conn: asyncpg.Connection) -> None:
    """With victims chosen regardless of groups (broken_group_twin), a request preempts its own
    group's borrowing work, and the model's check names it. The real engine, same steps: it
    preempts the other group's work instead."""
    now = CLOCK0
    await conn.execute("SELECT respool.create_pool(p_name => 'gp', p_capacity => $1)", {"gpu": 4})
    await conn.execute(
        "SELECT respool.create_policy(p_subject => 'lo', p_pool => 'gp', p_priority => 0)"
    )
    await conn.execute(
        "SELECT respool.create_policy(p_subject => 'hi', p_pool => 'gp', p_priority => 5)"
    )

    async def make(subject: str, gpu: int, group: str | None, at: datetime) -> Any:
        return await conn.fetchval(
            "SELECT (respool.create_request($1, p_now => $2)).request",
            {"subject": subject, "pool": "gp", "resources": {"gpu": gpu},
             "preemption_group": group, "lease_seconds": None},
            at,
        )  # fmt: skip

    async def run(expect_victim_group: str) -> list[str]:
        second = timedelta(seconds=1)
        theirs = await make("lo", 2, "other", now)
        mine = await make("lo", 2, "sweep", now + second)  # newest: first in victim order
        assert (theirs["status"], mine["status"]) == ("allocated", "allocated")
        asking = await make("hi", 2, "sweep", now + 2 * second)
        await conn.execute(
            "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = 'gp'), $1)",
            now + 3 * second,
        )
        victims = await conn.fetch(
            "SELECT preemption_group FROM respool.requests WHERE status = 'preempted'"
        )
        assert [v["preemption_group"] for v in victims] == [expect_victim_group]
        breaches = await preemption_breaches(conn)
        for rid in (theirs["id"], mine["id"], asking["id"]):
            await conn.execute(
                "SELECT respool.release_request(p_id => $1, p_now => $2)", rid, now + 4 * second
            )
        await conn.execute("DELETE FROM respool.events; DELETE FROM respool.requests")
        return breaches

    assert await run("other") == []
    await install_twin(conn, "broken_group_twin")
    [breach] = await run("sweep")
    assert "both in group sweep" in breach
