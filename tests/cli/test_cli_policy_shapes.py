"""Policy shapes on the command line (docs/preemption.md): ``attach-policy --lane/--no-lane
--window WINDOW --no-windows``, pattern subjects, ``list-policies`` / ``pool describe`` columns
LANE, WINDOWS, ACTIVE, NEXT CHANGE and COVERS, and ``request create --group``.

Whether a policy is active depends on the real clock here (the CLI has no clock of its own), so
the tests that check ACTIVE use one-time windows far in the past or future, or spanning now."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from cli.windows import WindowError, fmt_window, window_from_text
from support.cli import Cli, failed

BERLIN_OFFICE = "mon-fri 09:00-17:00 Europe/Berlin"


def _json(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(msgspec.json.encode(window_from_text(text)))
    return doc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BERLIN_OFFICE, {"timezone": "Europe/Berlin", "days": ["mon", "tue", "wed", "thu", "fri"],
                         "from": "09:00", "to": "17:00"}),
        ("09:00-17:00 UTC", {"timezone": "UTC", "from": "09:00", "to": "17:00"}),
        ("mon,wed,fri 22:00-06:00 UTC",
         {"timezone": "UTC", "days": ["mon", "wed", "fri"], "from": "22:00", "to": "06:00"}),
        ("fri-mon 00:00-00:00 UTC",
         {"timezone": "UTC", "days": ["mon", "fri", "sat", "sun"], "from": "00:00", "to": "00:00"}),
        ("Sat,SUN 10:00-12:30 America/New_York",
         {"timezone": "America/New_York", "days": ["sat", "sun"], "from": "10:00", "to": "12:30"}),
        ("2026-12-24T00:00Z/2026-12-27T00:00Z",
         {"start": "2026-12-24T00:00:00Z", "end": "2026-12-27T00:00:00Z"}),
        ("2026-12-24T01:00+01:00/2026-12-27T00:00Z",
         {"start": "2026-12-24T01:00:00+01:00", "end": "2026-12-27T00:00:00Z"}),
    ],
)  # fmt: skip
def test_a_window_on_the_command_line_becomes_the_api_object(
    text: str, expected: dict[str, Any]
) -> None:
    assert _json(text) == expected


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (BERLIN_OFFICE, BERLIN_OFFICE),
        ("mon-sun 09:00-17:00 UTC", "09:00-17:00 UTC"),  # every day: no day list
        ("mon,tue,wed,fri 22:00-06:00 UTC", "mon-wed,fri 22:00-06:00 UTC"),
        ("fri-mon 08:00-09:00 UTC", "fri-mon 08:00-09:00 UTC"),
        ("sat,sun 08:00-09:00 UTC", "sat,sun 08:00-09:00 UTC"),
        ("2026-12-24T01:00+01:00/2026-12-27T00:00Z", "2026-12-24T00:00Z/2026-12-27T00:00Z"),
    ],
)
def test_tables_show_windows_in_the_same_syntax(text: str, shown: str) -> None:
    assert fmt_window(window_from_text(text)) == shown
    assert fmt_window(window_from_text(shown)) == shown  # what a table shows reads back


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mon-fri 9-17 Europe/Berlin", "is not a window"),
        ("09:00-17:00", "has no time zone: end it with one, e.g. '09:00-17:00 UTC'"),
        ("mon-fry 09:00-17:00 UTC", "'fry' is not a day"),
        ("mon- 09:00-17:00 UTC", "a day list"),
        ("24:00-06:00 UTC", "is not a window"),
        ("2026-12-24T00:00/2026-12-27T00:00Z", "has no zone"),
        ("christmas/new-year", "is not an ISO timestamp"),
    ],
)
def test_a_bad_window_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(WindowError, match=says):
        window_from_text(text)


async def _policy(cli: Cli, pool: str, subject: str) -> dict[str, Any]:
    found = await cli.json("pool", "list-policies", pool, "--subject", subject)
    assert len(found) == 1, found
    policy: dict[str, Any] = found[0]
    return policy


def _row(table: str, subject: str) -> str:
    rows = [line for line in table.splitlines() if subject in line]
    assert len(rows) == 1, table
    return rows[0]


async def test_attach_policy_sets_lane_and_windows_and_update_keeps_or_removes_them(
    module_cli: Cli,
) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "office", "-c", "{gpu: 8}")
    made = await cli.json(
        "pool", "attach-policy", "office", "team:prod", "-r", "{gpu: 4}", "--lane",
        "--window", BERLIN_OFFICE, "--window", "sat 22:00-06:00 UTC",
    )  # fmt: skip
    assert made["priority_lane"] is True and made["reserved"] == {"gpu": 4}
    assert made["windows"] == [_json(BERLIN_OFFICE), _json("sat 22:00-06:00 UTC")]
    # A weekly window flips within a week: the answer says when, in the future.
    flips = datetime.fromisoformat(made["next_change"])
    assert datetime.now(UTC) < flips < datetime.now(UTC) + timedelta(days=8)

    row = _row((await cli.ok("pool", "list-policies", "office")).stdout, "team:prod")
    assert f"{BERLIN_OFFICE}; sat 22:00-06:00 UTC" in row
    assert flips.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") in row  # NEXT CHANGE, UTC ISO
    described = (await cli.ok("pool", "describe", "office")).stdout
    assert "LANE" in described and "WINDOWS" in described and "NEXT CHANGE" in described
    assert BERLIN_OFFICE in _row(described, "team:prod")

    # An update without shape options keeps lane and windows.
    kept = await cli.json("pool", "attach-policy", "office", "team:prod", "-p", "5")
    assert (kept["priority"], kept["priority_lane"]) == (5, True)
    assert kept["windows"] == made["windows"]

    gone = await cli.json(
        "pool", "attach-policy", "office", "team:prod", "--no-windows", "--no-lane"
    )
    assert (gone["windows"], gone["active"], gone["next_change"]) == (None, True, None)
    assert gone["priority_lane"] is False and gone["reserved"] == {"gpu": 4}
    row = _row((await cli.ok("pool", "list-policies", "office", "-o", "wide")).stdout, "team:prod")
    assert "always" in row and "yes" in row and "no" in row


async def test_one_time_windows_show_whether_the_share_is_in_force_now(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "once", "-c", "{gpu: 8}")
    cases = {
        "team:past": ("2020-01-01T00:00Z/2020-01-02T00:00Z", False, None),
        "team:later": ("2099-01-01T00:00Z/2099-01-02T00:00Z", False, "2099-01-01T00:00:00Z"),
        "team:now": ("2020-01-01T00:00Z/2099-01-01T00:00Z", True, "2099-01-01T00:00:00Z"),
    }
    for subject, (window, _, _) in cases.items():
        await cli.ok("pool", "attach-policy", "once", subject, "-r", "{gpu: 2}", "--window", window)
    table = (await cli.ok("pool", "list-policies", "once")).stdout
    for subject, (window, active, flips) in cases.items():
        policy = await _policy(cli, "once", subject)
        assert policy["active"] is active, subject
        next_change = policy["next_change"]
        assert (next_change and datetime.fromisoformat(next_change)) == (
            flips and datetime.fromisoformat(flips)
        ), subject
        row = _row(table, subject)
        assert window in row and (flips or "-") in row
        assert ("yes" if active else "no") in row.split(window, 1)[1]  # ACTIVE, after WINDOWS
    # Outside its window the reserved share is not in force: what it holds is borrowed.
    held = await cli.json("request", "create", "-s", "team:later", "--pool", "once", "--gpu", "1")
    assert held["status"] == "allocated"
    later = await _policy(cli, "once", "team:later")
    assert later["reserved"] == {"gpu": 2} and later["borrowed"].get("gpu") == 1


async def test_a_pattern_subject_is_one_quota_and_shows_what_it_covers(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "vision", "-c", "{gpu: 8}")
    made = await cli.json("pool", "attach-policy", "vision", "team-vision:*", "-l", "{gpu: 3}")
    assert made["subject"] == "team-vision:*" and made["covers"] == []
    for who in ("alice", "bob"):
        req = await cli.json("request", "create", "-s", f"team-vision:{who}", "--gpu", "1")
        assert (req["status"], req["pool"]) == ("allocated", "vision")
    policy = await _policy(cli, "vision", "team-vision:*")
    assert policy["covers"] == ["team-vision:alice", "team-vision:bob"]
    assert policy["usage"]["gpu"] == 2
    row = _row((await cli.ok("pool", "list-policies", "vision")).stdout, "team-vision:*")
    assert "team-vision:alice, team-vision:bob" in row  # COVERS
    # The limit bounds the whole team: a third GPU fits, a fourth waits for the team's limit
    # although the pool has free GPUs and dave holds nothing.
    third = await cli.json("request", "create", "-s", "team-vision:carol", "--gpu", "1")
    assert third["status"] == "allocated"
    fourth = await cli.json("request", "create", "-s", "team-vision:dave", "--gpu", "1")
    assert fourth["status"] == "queued" and "limit" in fourth["message"], fourth
    # The same pattern updates the same policy (found by its subject text).
    updated = await cli.json("pool", "attach-policy", "vision", "team-vision:*", "-l", "{gpu: 4}")
    assert updated["id"] == made["id"] and updated["limit"] == {"gpu": 4}


async def test_bad_shape_options_are_one_line_errors(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "bad", "-c", "{gpu: 8}")
    err = failed(
        await cli.api("pool", "attach-policy", "bad", "team:x", "--window", "9-17 Berlin"), code=2
    )
    assert "--window" in err and "9-17 Berlin" in err
    both = ("--window", BERLIN_OFFICE, "--no-windows")
    assert "--window" in failed(await cli.api("pool", "attach-policy", "bad", "team:x", *both), 2)
    mars = ("--window", "09:00-17:00 Mars/Base")
    unknown_zone = failed(await cli.api("pool", "attach-policy", "bad", "team:x", *mars), code=2)
    assert unknown_zone.startswith("--window: unknown time zone Mars/Base"), unknown_zone
    assert await cli.json("pool", "list-policies", "bad") == []  # nothing was created


async def test_request_create_group_is_kept_on_every_member(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "grp", "-c", "{gpu: 8}")
    await cli.ok("pool", "attach-policy", "grp", "team:grp")
    one = await cli.json("request", "create", "-s", "team:grp", "--gpu", "1", "--group", "run-42")
    assert one["preemption_group"] == "run-42"
    shown = (await cli.ok("request", "describe", one["id"])).stdout
    assert "Preemption group" in shown and "run-42" in shown
    many = await cli.json(
        "request", "create", "-s", "team:grp", "--gpu", "1", "--count", "3", "--group", "run-7"
    )
    assert [r["preemption_group"] for r in many] == ["run-7"] * 3
    plain = await cli.json("request", "create", "-s", "team:grp", "--gpu", "1")
    assert plain["preemption_group"] is None
    err = failed(await cli.api("request", "create", "-s", "team:grp", "--group", "x" * 129), 2)
    assert "--group" in err
