"""A ZenML orchestrator flavor that runs isolated dynamic-pipeline steps as local subprocesses.

Only for the end-to-end test: ZenML's local orchestrator runs every step inline, and a step must
run isolated (its own process, with its own heartbeat) for ZenML to interrupt it on preemption.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Any

from zenml.client import Client
from zenml.enums import ExecutionStatus
from zenml.orchestrators import utils as orchestrator_utils
from zenml.orchestrators.local.local_orchestrator import (
    LocalOrchestrator,
    LocalOrchestratorFlavor,
)
from zenml.step_operators.step_operator_entrypoint_configuration import (
    StepOperatorEntrypointConfiguration,
)

_PROCS: dict[Any, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()


class SubprocessOrchestrator(LocalOrchestrator):
    """The local orchestrator, with isolated steps in child processes."""

    def submit_isolated_step(self, step_run_info: Any, environment: dict[str, str]) -> None:
        command, args = orchestrator_utils.get_step_entrypoint_command(
            invocation_id=step_run_info.pipeline_step_name,
            config=step_run_info.config,
            entrypoint_config_class=StepOperatorEntrypointConfiguration,
            snapshot_id=step_run_info.snapshot.id,
            step_run_id=str(step_run_info.step_run_id),
        )
        proc = subprocess.Popen(
            command + args, env={**os.environ, **environment}, start_new_session=True
        )
        with _LOCK:
            _PROCS[step_run_info.step_run_id] = proc

    def get_isolated_step_status(self, step_run: Any) -> ExecutionStatus:
        with _LOCK:
            proc = _PROCS.get(step_run.id)
        server = Client().get_run_step(step_run.id, hydrate=False).status
        if proc is not None and proc.poll() is None:
            return server if server.is_finished else ExecutionStatus.RUNNING
        if server.is_finished:
            return server
        return ExecutionStatus.FAILED  # the process ended without reporting a final status

    def stop_isolated_step(self, step_run: Any) -> None:
        with _LOCK:
            proc = _PROCS.get(step_run.id)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)


class SubprocessOrchestratorFlavor(LocalOrchestratorFlavor):
    """Flavor ``subprocess`` of :class:`SubprocessOrchestrator`."""

    @property
    def name(self) -> str:
        return "subprocess"

    @property
    def implementation_class(self) -> type[SubprocessOrchestrator]:
        return SubprocessOrchestrator
