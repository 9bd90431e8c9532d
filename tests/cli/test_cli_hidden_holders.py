"""What the CLI prints where a client token's answer blanks another subject (docs/api.md, "What a
client sees"): ``(hidden)`` holders on a node, and an event's cause only when it was sent."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from respool_client.wire import Event, Node, NodeAllocation
from rich.console import Console

from cli.tables import events_table, node_allocations_table, node_devices_table


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_node_shows_hidden_holders_without_inventing_names() -> None:
    mine = uuid4()
    now = datetime.now(UTC)
    node = Node(
        id=uuid4(),
        name="gpu-01",
        pool="boxes",
        labels={},
        capacity={"gpu": 4},
        devices={"gpu": ["0", "1", "2", "3"]},
        state="active",
        usage={"gpu": 3},
        allocations=[
            NodeAllocation(mine, "team-b:x", "allocated", {"gpu": 1}, {"gpu": ["0"]}),
            NodeAllocation(None, None, "allocated", {"gpu": 2}, {"gpu": ["1", "2"]}),
        ],
        created_at=now,
        updated_at=now,
    )
    devices = _text(node_devices_table(node))
    rows = {line.split()[1]: line.split()[2:] for line in devices.splitlines() if "gpu" in line}
    assert rows == {
        "0": [str(mine)[:8], "team-b:x"],
        "1": ["(hidden)", "(hidden)"],
        "2": ["(hidden)", "(hidden)"],
        "3": ["-", "-"],
    }
    allocations = _text(node_allocations_table(node))
    assert "(hidden)" in allocations and "None" not in allocations


def test_an_event_names_its_cause_only_when_the_answer_has_it() -> None:
    cause = uuid4()
    at = datetime.now(UTC)
    message = "preempted (reclaim) for another request"
    seen = Event(
        "allocated", "preempted", "reclaim", 1, message, at,
        cause_request_id=cause, cause_subject="team-a:y",
    )  # fmt: skip
    blanked = Event("allocated", "preempted", "reclaim", 1, message, at)
    assert f"{message} (request {str(cause)[:8]} of team-a:y)" in _text(events_table([seen]))
    text = _text(events_table([blanked]))
    assert message in text and "request " + str(cause)[:8] not in text and "None" not in text
