"""Parsing resource maps given on the command line: JSON or YAML maps, and ``key=N`` pairs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

import typer
import yaml
from respool_client.pairs import amounts, labels, selector

__all__ = ["parse_decimal", "parse_labels", "parse_map", "parse_pairs", "parse_selector"]

_MAP_HINT = """expected a map of resource key to integer, e.g. '{"gpu": 8}' or 'gpu: 8'"""


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise typer.BadParameter(f"not JSON or YAML; {_MAP_HINT}") from None


def parse_map(text: str) -> dict[str, int]:
    """``'{"gpu": 8}'`` (JSON) or ``'gpu: 8'`` / ``'{gpu: 8, step_run: 32}'`` (YAML)."""
    data = _load(text)
    if not isinstance(data, dict):
        raise typer.BadParameter(_MAP_HINT)
    out: dict[str, int] = {}
    for key, value in data.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int):
            raise typer.BadParameter(f"{key}: {value!r} is not an integer; {_MAP_HINT}")
        out[key] = value
    return out


def parse_pairs(pairs: Iterable[str], option: str) -> dict[str, int]:
    """``["tpu=2", "licence_x=1"]`` → ``{"tpu": 2, "licence_x": 1}`` (the rule of
    :mod:`respool_client.pairs`, shared with ``respool run``)."""
    try:
        return amounts(pairs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def parse_labels(pairs: Iterable[str]) -> dict[str, str]:
    """``["run=nightly", "step=train"]`` → ``{"run": "nightly", "step": "train"}``."""
    try:
        return labels(pairs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--label") from None


def parse_selector(items: Iterable[str], node: str | None = None) -> dict[str, str]:
    """``--selector k=v`` (repeatable) and ``--node NAME`` as one node selector."""
    try:
        return selector(items, node)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--selector") from None


def parse_decimal(text: str) -> Decimal:
    """A CPU count as written (``0.5``, ``8.05``): sent as that exact JSON number."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise typer.BadParameter(f"{text!r} is not a number") from None
    if not value.is_finite():
        raise typer.BadParameter(f"{text!r} is not a finite number")
    return value
