"""How ZenML's server loads the plug-in (docs/zenml.md, "Check that the plug-in loaded"), with
ZenML's own loader, ``zenml.zen_server.utils.initialize_resource_pool_store``, in ZenML's venv.

ZenML turns only a module it cannot import into "no resource pools" (one warning); any other
error stops its server at start-up. A misspelt class must say which source is meant.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.proc import run
from zenml_e2e.harness import ZENML_PYTHON, zenml_available

pytestmark = pytest.mark.zenml

# Run as a file, as the server runs: ZenML resolves sources relative to the main module's file.
LOAD = """
from zenml.zen_server import utils
utils.initialize_zen_store()  # as the server's start-up does, just before the plug-in
try:
    utils.initialize_resource_pool_store()
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
else:
    print("LOADED", type(utils._resource_pool_store).__name__)
"""


def _load(source: str, tmp_path: Path) -> str:
    why = zenml_available()
    if why is not None:
        pytest.skip(why)
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZENML_", "RESPOOL_"))}
    env |= {
        "ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE": source,
        "ZENML_CONFIG_PATH": str(tmp_path / "zenml-config"),
        "ZENML_STORE_URL": f"sqlite:///{tmp_path / 'zenml.db'}",
        "ZENML_ANALYTICS_OPT_IN": "false",
    }
    done = run([str(ZENML_PYTHON), str(script)], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_documented_source_loads(tmp_path: Path) -> None:
    out = _load("respool_zenml.store.RespoolResourcePoolStore", tmp_path)
    assert "LOADED RespoolResourcePoolStore" in out, out


def test_a_misspelt_class_names_the_source_to_set(tmp_path: Path) -> None:
    out = _load("respool_zenml.store.RespoolResourcePoolStor", tmp_path)
    (line,) = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert line.startswith("ERROR AttributeError"), out
    assert "'RespoolResourcePoolStor'" in line
    assert (
        "ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE="
        "respool_zenml.store.RespoolResourcePoolStore" in line
    )


def test_a_module_zenml_cannot_find_is_one_warning_and_no_pools(tmp_path: Path) -> None:
    # ZenML's behaviour, which the page describes: the server starts without resource pools.
    out = _load("respool_zenml.stor.RespoolResourcePoolStore", tmp_path)
    assert "Unable to load resource pool store source." in out, out
    assert "LOADED NoneType" in out
