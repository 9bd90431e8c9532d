"""The ZenML side of tests/zenml_e2e/test_zenml_e2e.py and bench/zenml_handoff.py (ZenML's venv).

``python drive.py setup`` registers the stacks; ``python drive.py run KIND STACK GPUS HOLD
[GPU_CLASS]`` runs one dynamic pipeline on STACK and prints one JSON line: the run's name and
status, the error if it failed, and each step's start and end as the step itself saw them.
KIND: ``pair`` (two steps competing for GPUS each) or ``one`` (a single step); GPU_CLASS: the
steps' ``ResourceSettings.gpu_class``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

from zenml.client import Client
from zenml.config import ResourceSettings
from zenml.enums import ResourceRequestReclaimTolerance, StackComponentType
from zenml.pipelines import pipeline
from zenml.steps import step

LOG = os.environ["ZT_STEP_LOG"]

# ZenML interrupts a preempted step as SIGINT would (``_thread.interrupt_main``), which does
# nothing where SIGINT is ignored: a shell without job control starts its background jobs so,
# and the step processes inherit it. Handled here, it is the default again in every step.
signal.signal(signal.SIGINT, signal.default_int_handler)


@step
def work(tag: str, hold: float) -> str:
    start = time.time()
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": tag, "event": "start", "at": start, "pid": os.getpid()}) + "\n")
    while time.time() < start + hold:  # short sleeps: ZenML interrupts a step between them
        time.sleep(0.1)
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": tag, "event": "end", "at": time.time()}) + "\n")
    return tag


def settings(gpus: int, isolated: bool, gpu_class: str | None) -> dict[str, ResourceSettings]:
    if isolated:  # explicit: a preemptible (borrowing) isolated step
        tolerance = ResourceRequestReclaimTolerance.ANY
        return {
            "resources": ResourceSettings(
                gpu_count=gpus, gpu_class=gpu_class, reclaim_tolerance=tolerance
            )
        }
    # inline: ZenML makes it `none`
    return {"resources": ResourceSettings(gpu_count=gpus, gpu_class=gpu_class)}


@pipeline(dynamic=True, enable_cache=False)
def pair(gpus: int, hold: float, isolated: bool, gpu_class: str | None = None) -> None:
    s = work.with_options(settings=settings(gpus, isolated, gpu_class))
    a = s.submit("a", hold)
    b = s.submit("b", hold)
    a.load()
    b.load()


@pipeline(dynamic=True, enable_cache=False)
def one(gpus: int, hold: float, isolated: bool, gpu_class: str | None = None) -> None:
    work.with_options(settings=settings(gpus, isolated, gpu_class))("a", hold)


def setup() -> None:
    c = Client()
    c.create_flavor(
        source="isolated.SubprocessOrchestratorFlavor",
        component_type=StackComponentType.ORCHESTRATOR,
    )
    # "nodes": a local orchestrator whose subject has a policy on the pool backed by nodes only;
    # "two": one whose subject has policies on two pools.
    for name, flavor in (
        ("iso", "subprocess"),
        ("free", "local"),
        ("nodes", "local"),
        ("two", "local"),
    ):
        c.create_stack_component(
            name=name,
            flavor=flavor,
            component_type=StackComponentType.ORCHESTRATOR,
            configuration={},
        )
        c.create_stack(
            name=name,
            components={
                StackComponentType.ORCHESTRATOR: name,
                StackComponentType.ARTIFACT_STORE: "default",
            },
        )
    print(json.dumps({"ok": True}))


def run(kind: str, stack: str, gpus: int, hold: float, gpu_class: str | None = None) -> None:
    c = Client()
    c.activate_stack(stack)
    chosen = {"pair": pair, "one": one}[kind]
    out: dict[str, object] = {"error": None}
    try:
        r = chosen.with_options(run_name=f"{kind}-{stack}-{time.time_ns()}")(
            gpus=gpus, hold=hold, isolated=stack == "iso", gpu_class=gpu_class
        )
        out["run"] = r.name if r is not None else None
    except Exception as exc:  # the test asserts on the message
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["trace"] = traceback.format_exc()[-3000:]
    runs = c.list_pipeline_runs(sort_by="desc:created", size=1)
    last = runs.items[0]
    out["run"] = last.name
    out["status"] = str(last.status.value)
    out["steps"] = {name: str(s.status.value) for name, s in last.steps.items()}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup()
    else:
        gpu_class = sys.argv[6] if len(sys.argv) > 6 else None
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), gpu_class)
