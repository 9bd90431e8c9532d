"""``KEY=VALUE`` and ``KEY=N`` options, one parser for the ``respool`` CLI and ``respool run``.

Spaces around the key and around the value are dropped (``"run = nightly"`` is
``{"run": "nightly"}``), so a value cannot begin or end with a space; the key must not be empty.
The amount of ``KEY=N`` is an integer; whether it is allowed (>= 0, a known key) is the
server's to say, with the field it names.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = [
    "NODE_LABEL",
    "amounts",
    "host_node_name",
    "labels",
    "mebibytes",
    "percent",
    "raising",
    "selector",
    "split_amount",
    "split_pair",
]

T = TypeVar("T")

# The built-in label every node carries: its name (docs/placement.md).
NODE_LABEL = "node"

# A device's memory (docs/placement.md, "Sharing a GPU"), counted in MiB: a whole number of
# MiB, or a number with the unit MiB, GiB or TiB (also Mi, Gi, Ti; any case).
_MIB = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(mib|mi|gib|gi|tib|ti)?\s*$", re.IGNORECASE)
_MIB_PER = {"": 1, "mi": 1, "gi": 1024, "ti": 1024 * 1024}
SIZE_HINT = "a whole number of MiB (20480), or MiB/GiB/TiB (512MiB, 20GiB)"


def mebibytes(text: str, minimum: int = 1) -> int:
    """A device memory size in MiB: ``"20GiB"`` → 20480, ``"512MiB"`` → 512, ``"20480"`` →
    20480, ``"1.5GiB"`` → 1536; ``ValueError`` (one line, with the forms taken) for anything
    else: a decimal unit (``20GB``: GPU memory is counted in MiB), a fraction of a MiB, less
    than ``minimum``."""
    m = _MIB.match(text)
    if not m or (m.group(2) is None and "." in m.group(1)):
        raise ValueError(f"{text!r} is not a size: give {SIZE_HINT}")
    unit = (m.group(2) or "").lower().removesuffix("b")
    whole, _, frac = m.group(1).partition(".")
    per = _MIB_PER[unit]
    scale = 10 ** len(frac)
    units = int(whole) * per * scale + (int(frac) * per if frac else 0)
    if units % scale:
        raise ValueError(f"{text!r} is not a whole number of MiB")
    value: int = units // scale
    if value < minimum:
        raise ValueError(f"{text!r}: a size must be at least {minimum} MiB")
    return value


def percent(text: str) -> int:
    """A compute share in percent, 1 to 100 (``"50"``, ``"50%"``); ``ValueError`` else."""
    raw = text.strip().removesuffix("%").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise ValueError(f"{text!r} is not a share: give a whole percent from 1 to 100")
    return int(raw)


def raising(parse: Callable[[str], T], error: Callable[[str], Exception]) -> Callable[[str], T]:
    """``parse`` (e.g. :func:`mebibytes`) as an option's parser: its ``ValueError`` raised as
    ``error`` with the same message (the CLI's usage error: ``typer.BadParameter``,
    ``argparse.ArgumentTypeError``)."""

    def parsed(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise error(str(exc)) from None

    return parsed


def split_pair(text: str) -> tuple[str, str]:
    """``"run=nightly"`` → ``("run", "nightly")``; ``ValueError`` without ``=`` or a key."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def split_amount(text: str) -> tuple[str, int]:
    """``"tpu=2"`` → ``("tpu", 2)``; ``ValueError`` unless the amount is an integer."""
    key, value = split_pair(text)
    try:
        return key, int(value)
    except ValueError:
        raise ValueError(f"{key}={value}: the amount must be an integer") from None


def amounts(pairs: Iterable[str]) -> dict[str, int]:
    """``["tpu=2", "licence_x=1"]`` → ``{"tpu": 2, "licence_x": 1}`` (a repeated key: the last)."""
    return dict(split_amount(pair) for pair in pairs)


def labels(pairs: Iterable[str]) -> dict[str, str]:
    """``["run=nightly", "step=train"]`` → ``{"run": "nightly", "step": "train"}``."""
    return dict(split_pair(pair) for pair in pairs)


def selector(pairs: Iterable[str], node: str | None = None) -> dict[str, str]:
    """A node selector (docs/placement.md): ``["gpu-type=A100-80G"]`` →
    ``{"gpu-type": "A100-80G"}``; ``node`` (``--node NAME``) is the pair ``node=NAME``. Every
    pair must match the node's labels, so one label asked with two values is refused, as is
    ``--node`` with another ``node=`` pair. Whether a label key is valid is the server's to say."""
    out: dict[str, str] = {}
    given = [split_pair(pair) for pair in pairs]
    if node is not None:
        given.append((NODE_LABEL, node.strip()))
    for key, value in given:
        if key in out and out[key] != value:
            raise ValueError(
                f"{key}: asked for {out[key]!r} and {value!r}; a node has one value per label"
            )
        out[key] = value
    return out


_NOT_NAME = re.compile(r"[^a-z0-9._-]+")


def host_node_name(hostname: str | None = None) -> str:
    """The node name of a machine (``respool node register`` and ``respool run --here`` agree on
    it): its hostname (default: this machine's) in lower case, every run of characters outside
    ``[a-z0-9._-]`` turned into ``-``, leading ``.``/``_``/``-`` dropped, at most 63 characters
    (the node-name pattern). ``GPU-Box_01.Lab`` → ``gpu-box_01.lab``."""
    raw = socket.gethostname() if hostname is None else hostname
    name = _NOT_NAME.sub("-", raw.strip().lower()).lstrip("._-")[:63]
    if not name:
        raise ValueError(f"hostname {raw!r} gives no node name: name the node (--node, --name)")
    return name
