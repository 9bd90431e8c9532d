"""``request list`` as people filter it: REASON says why a queued request waits, ``--label``
filters (every pair), ``-o wide`` adds LABELS, a bad ``--status`` lists the valid ones,
``--watch`` redraws; ``request cancel``/``release`` take several ids; completion of pool names,
subjects, request ids and statuses (from the API, failing silently)."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from cli.main import app
from support.cli import Cli, failed

NOWHERE = "http://127.0.0.1:1"  # nothing listens on port 1


@pytest.fixture(scope="module")
async def labelled(module_cli: Cli) -> dict[str, dict[str, object]]:
    """A pool of 2 GPUs: ``a`` holds both, ``b`` and ``c`` wait; each with its labels."""
    cli = module_cli
    await cli.ok("pool", "create", "filters", "-c", '{"gpu": 2}')
    await cli.ok("pool", "attach-policy", "filters", "team:*")
    out: dict[str, dict[str, object]] = {}
    for name, gpus, labels in (
        ("a", "2", ["team=vision", "run=1"]),
        ("b", "1", ["team=vision", "run=2"]),
        ("c", "1", ["team=nlp", "run=2"]),
    ):
        flags = [x for label in labels for x in ("--label", label)]
        out[name] = await cli.json(
            "request", "create", "-s", f"team:{name}", "--pool", "filters", "--gpu", gpus, *flags
        )
    assert [out[n]["status"] for n in "abc"] == ["allocated", "queued", "queued"]
    return out


async def test_reason_shows_why_a_queued_request_waits(
    module_cli: Cli, labelled: dict[str, dict[str, object]]
) -> None:
    text = (await module_cli.ok("request", "list", "--pool", "filters")).stdout
    row = next(line for line in text.splitlines() if str(labelled["b"]["id"])[:8] in line)
    assert "queued" in row and str(labelled["b"]["message"]) in row
    assert "waiting for gpu" in row


async def test_label_filters_every_pair_and_wide_shows_labels(
    module_cli: Cli, labelled: dict[str, dict[str, object]]
) -> None:
    cli = module_cli
    ids = {n: str(r["id"]) for n, r in labelled.items()}
    vision = await cli.json("request", "list", "--pool", "filters", "--label", "team=vision")
    assert {r["id"] for r in vision} == {ids["a"], ids["b"]}
    both = await cli.json(
        "request", "list", "--pool", "filters", "--label", "team=vision", "-l", "run=2"
    )
    assert [r["id"] for r in both] == [ids["b"]]
    assert await cli.json("request", "list", "--label", "team=nobody") == []

    plain = (await cli.ok("request", "list", "--pool", "filters")).stdout
    assert "LABELS" not in plain
    wide = (await cli.ok("request", "list", "--pool", "filters", "-o", "wide")).stdout
    assert "LABELS" in wide.splitlines()[0] and "run=2 team=nlp" in wide

    bad = failed(await cli.api("request", "list", "--label", "team"), code=2)
    assert "--label" in bad


async def test_a_bad_status_lists_the_valid_ones(module_cli: Cli) -> None:
    err = failed(await module_cli.api("request", "list", "--status", "quued"), code=2)
    assert err.startswith("--status: 'quued' is not a status (did you mean queued?)")
    for status in ("queued", "allocated", "preempting", "released", "cancelled", "rejected"):
        assert status in err


async def test_cancel_and_release_take_several_ids(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "several", "-c", '{"gpu": 4}')
    await cli.ok("pool", "attach-policy", "several", "crew:*")
    made = [
        await cli.json("request", "create", "-s", "crew:x", "--pool", "several", "--gpu", "1")
        for _ in range(4)
    ]
    ids = [str(r["id"]) for r in made]
    released = await cli.json("request", "release", ids[0][:8], ids[1])
    assert [(r["id"], r["status"]) for r in released] == [
        (ids[0], "released"),
        (ids[1], "released"),
    ]
    # one bad id: said on its own line, the others still cancelled, exit 1
    result = await cli.api("request", "cancel", ids[2], "ffffffff", ids[3])
    assert result.exit_code == 1
    assert "error: ffffffff: no request id starts with ffffffff" in result.stderr
    assert result.stderr.count(": cancelled: ") == 2
    listed = {
        r["id"]: r["status"] for r in await cli.json("request", "list", "--pool", "several", "-a")
    }
    assert listed[ids[2]] == listed[ids[3]] == "cancelled"
    # --attempt fences one request
    assert "--attempt" in failed(
        await cli.api("request", "cancel", ids[2], ids[3], "--attempt", "1"), code=2
    )


async def test_watch_redraws_until_interrupted(
    module_cli: Cli, labelled: dict[str, dict[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # the second nap is "Ctrl-C"
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("cli.watch.sleep", sleep)
    for command in (("request", "list", "--pool", "filters"), ("pool", "requests", "filters")):
        naps.clear()
        result = await module_cli.ok(*command, "--watch", "2")
        assert naps == [2.0, 2.0]
        assert result.stdout.count("Every 2s") == 2 and result.stdout.count("(Ctrl-C to stop)") == 2
        assert result.stdout.count(str(labelled["b"]["id"])[:8]) == 2

    err = failed(await module_cli.api("request", "list", "--watch", "1", "-o", "json"), code=2)
    assert "--watch" in err


async def _complete(cli: Cli, words: str, url: str | None = None) -> list[str]:
    """What bash completion offers for ``words`` (the real completion protocol)."""
    env = {
        "_RESPOOL_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        "RESPOOL_URL": url or cli.url,
        "RESPOOL_TOKEN": None,
    }
    result = await asyncio.to_thread(CliRunner().invoke, app, [], prog_name="respool", env=env)
    assert result.exit_code == 0 and result.stderr == "", result.output
    return result.stdout.split()


async def test_completion_of_pools_subjects_request_ids_and_statuses(
    module_cli: Cli, labelled: dict[str, dict[str, object]]
) -> None:
    cli = module_cli
    assert "filters" in await _complete(cli, "respool pool describe ")
    assert await _complete(cli, "respool pool describe filt") == ["filters"]
    assert await _complete(cli, "respool request list --pool filt") == ["filters"]
    assert await _complete(cli, "respool request list --status q") == ["queued"]
    assert set(await _complete(cli, "respool request list --status p")) == {
        "preempting",
        "preempted",
    }
    # subjects: a policy's own, and those a pattern policy serves now
    subjects = await _complete(cli, "respool request create -s team:")
    assert "team:a" in subjects
    # request ids: the short ids tables show, by prefix
    rid = str(labelled["b"]["id"])[:8]
    assert rid in await _complete(cli, "respool request cancel ")
    assert await _complete(cli, f"respool request describe {rid[:6]}") == [rid]


async def test_completion_fails_silently_without_an_api(module_cli: Cli) -> None:
    assert await _complete(module_cli, "respool pool describe ", url=NOWHERE) == []
    assert await _complete(module_cli, "respool request cancel ", url=NOWHERE) == []
    # static values still complete
    assert await _complete(module_cli, "respool request list --status c", url=NOWHERE) == [
        "cancelled"
    ]
