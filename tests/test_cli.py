from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.db.migrate import load_migrations
from cli.main import app, main


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_db_migrate_and_status(runner: CliRunner, empty_db_url: str) -> None:
    env = {"RESPOOL_DATABASE_URL": empty_db_url}
    names = [f.name for f in load_migrations()]

    result = runner.invoke(app, ["db", "status"], env=env)
    assert result.exit_code == 1, result.output
    assert "NOT current" in result.output
    assert f"pending  {names[0]}" in result.output

    result = runner.invoke(app, ["db", "migrate"], env=env)
    assert result.exit_code == 0, result.output
    for name in names:
        assert f"applied     {name}" in result.output
    assert "schema      current" in result.output

    result = runner.invoke(app, ["db", "migrate"], env=env)
    assert result.exit_code == 0, result.output
    assert "nothing to apply" in result.output
    assert "repeatables unchanged" in result.output

    result = runner.invoke(app, ["db", "status"], env=env)
    assert result.exit_code == 0, result.output
    assert "schema: current" in result.output


def test_connection_error_is_one_line(runner: CliRunner) -> None:
    env = {"RESPOOL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    result = runner.invoke(app, ["db", "status"], env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot connect to the database")
    assert "Traceback" not in result.output


def test_settings_error_is_one_line(runner: CliRunner) -> None:
    result = runner.invoke(app, ["db", "status"], env={"RESPOOL_PORT": "nope"})
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: RESPOOL_PORT: expected an integer, got 'nope'"


def test_main_exit_codes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    monkeypatch.setenv("RESPOOL_DATABASE_URL", db_url)
    with pytest.raises(SystemExit) as info:
        main(["db", "status"])
    assert info.value.code == 0
    assert "schema: current" in capsys.readouterr().out

    monkeypatch.setenv("RESPOOL_DATABASE_URL", "postgresql://x@127.0.0.1:5432/db?sslmode=bogus")
    with pytest.raises(SystemExit) as info:
        main(["db", "migrate"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
