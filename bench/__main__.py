"""``python -m bench <name> [options]``: respool's benchmarks (docs/benchmarks.md).

``python -m bench all`` runs every scenario against one durable PostgreSQL server in one run and
writes the report; ``python -m bench <scenario>`` runs one and prints its figures as JSON;
``python -m bench wake`` is the stand-alone wake-latency benchmark (docs/api.md);
``python -m bench eta`` measures the ETA calibration on a replayed trace, before and after
(docs/scheduling.md, "ETA");
``python -m bench placement`` measures pools backed by nodes (docs/placement.md);
``python -m bench jobs`` measures jobs run by node agents (docs/jobs.md);
``python -m bench depth`` times a release that grants against the queue's length (docs/engine.md);
``python -m bench rate`` measures rate keys: reservations/s, a saturated window, refill delay
(docs/rates.md);
``python -m bench sharing`` measures grants of slices of shared GPUs (docs/placement.md);
``python -m bench versus`` times the engine's cycle with this tree's SQL functions against another
commit's, side by side (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from bench import (
    baseline,
    batch,
    burst,
    cycles,
    dashboard,
    depth,
    eta,
    gang,
    jobs,
    placement,
    rate,
    sharing,
    suite,
    sweep,
    versus,
    wake,
)

ONE = {
    "cycles": cycles.SUMMARY,
    "http": "HTTP cycles through one respool serve process",
    "waiters": "10,000 long-polls on one API process, woken by one large release",
    "reconcile": "cost of one reconciler pass against the queue size, idle and with churn",
    "peer": "pgqueuer's throughput on the same server (pip install 'respool[bench]')",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    wake.add_arguments(commands.add_parser("wake", help=wake.SUMMARY, description=wake.SUMMARY))
    for mod, name in (
        (baseline, "baseline"),
        (batch, "batch"),
        (burst, "burst"),
        (depth, "depth"),
        (gang, "gang"),
        (sweep, "sweep"),
        (placement, "placement"),
        (jobs, "jobs"),
        (rate, "rate"),
        (sharing, "sharing"),
        (versus, "versus"),
    ):
        mod.add_arguments(commands.add_parser(name, help=mod.SUMMARY, description=mod.SUMMARY))
    dashboard.add_arguments(
        commands.add_parser("dashboard", help=dashboard.SUMMARY, description=dashboard.SUMMARY)
    )
    eta.add_arguments(commands.add_parser("eta", help=eta.SUMMARY, description=eta.__doc__))
    everything = "every scenario in one run; writes docs/benchmarks.md"
    suite.add_arguments(
        commands.add_parser("all", help=everything, description=everything), full=True
    )
    for name, summary in ONE.items():
        suite.add_arguments(
            commands.add_parser(name, help=summary, description=summary), full=False
        )
    args = parser.parse_args(argv)
    if args.command == "wake":
        return wake.run(args)
    if args.command == "dashboard":
        return dashboard.run(args)
    if args.command == "eta":
        return eta.run(args)
    if args.command in (
        "baseline",
        "batch",
        "burst",
        "depth",
        "gang",
        "sweep",
        "placement",
        "jobs",
        "rate",
        "sharing",
        "versus",
    ):
        runner: Callable[[argparse.Namespace], int] = {
            "baseline": baseline.run,
            "batch": batch.run,
            "burst": burst.run,
            "depth": depth.run,
            "jobs": jobs.run,
            "gang": gang.run,
            "sweep": sweep.run,
            "placement": placement.run,
            "rate": rate.run,
            "sharing": sharing.run,
            "versus": versus.run,
        }[args.command]
        return runner(args)
    if args.command == "all":
        return suite.run_all(args)
    return suite.run_one(args.command, args)


if __name__ == "__main__":
    sys.exit(main())
