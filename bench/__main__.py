"""``python -m bench <name> [options]``; ``python -m bench wake --help`` for one benchmark."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import wake


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    wake.add_arguments(commands.add_parser("wake", help=wake.SUMMARY, description=wake.SUMMARY))
    args = parser.parse_args(argv)
    if args.command == "wake":
        return wake.run(args)
    parser.error(f"unknown benchmark {args.command!r}")  # exits


if __name__ == "__main__":
    sys.exit(main())
