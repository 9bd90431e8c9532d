"""A request's ``placement`` (or ``last_placement``) as the engine answers it, for comparing
whole answers in one line."""

from __future__ import annotations

from typing import Any

__all__ = ["gpu_placement"]


def gpu_placement(
    node: str,
    devices: list[str],
    *,
    labels: dict[str, str] | None = None,
    slices: dict[str, dict[str, int]] | None = None,
    isolation: str = "exclusive",
) -> dict[str, Any]:
    """The placement of a grant of ``devices`` of key gpu on ``node`` (with its ``labels``):
    ``slices`` by device when it holds slices of them (none when whole), and the key's
    ``isolation``."""
    return {
        "node": node,
        "labels": labels or {},
        "devices": {"gpu": devices},
        "slices": {"gpu": slices} if slices else {},
        "isolation": {"gpu": isolation},
    }
