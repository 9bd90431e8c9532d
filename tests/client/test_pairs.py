"""One KEY=N / KEY=VALUE rule for ``respool run`` and the ``respool`` CLI
(``respool_client.pairs``): spaces around key and value dropped, an empty key or a missing
``=`` refused, the amount an integer."""

from __future__ import annotations

import pytest
import typer
from respool_client.pairs import amounts, labels, split_pair
from respool_client.run import build_parser

from cli.maps import parse_labels, parse_pairs


def test_spaces_around_key_and_value_are_dropped_by_both_commands() -> None:
    args = build_parser().parse_args(
        ["--label", " run = nightly ", "-r", " tpu = 2", "--label", "a=b=c", "--", "true"]
    )
    assert dict(args.label) == {"run": "nightly", "a": "b=c"}
    assert dict(args.resource) == {"tpu": 2}
    assert parse_labels([" run = nightly ", "a=b=c"]) == dict(args.label)
    assert parse_pairs([" tpu = 2"], "--resource") == dict(args.resource)
    assert labels(["empty="]) == {"empty": ""}
    assert amounts(["tpu=2", "tpu=3"]) == {"tpu": 3}


@pytest.mark.parametrize("bad", ["novalue", "=1", " =1"])
def test_no_key_is_refused_by_both_commands(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        split_pair(bad)
    with pytest.raises(typer.BadParameter, match="expected KEY=VALUE"):
        parse_labels([bad])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--label", bad, "--", "true"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_an_amount_must_be_an_integer_in_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.BadParameter, match="must be an integer"):
        parse_pairs(["tpu=1.5"], "--resource")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-r", "tpu=1.5", "--", "true"])
    assert "must be an integer" in capsys.readouterr().err
