#!/usr/bin/env bash
# Makes ZenML's own venv for tests/zenml_e2e (the e2e test) and bench/zenml_handoff.py:
# ZenML's dependencies may clash with respool's, so it never shares .venv.
# Usage (from .ci/run, at the repository root): bash integrations/zenml/ci-install.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${RESPOOL_ZENML_VENV:-.venv-zenml}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q 'zenml[server]==0.98.0' </dev/null
"$VENV/bin/pip" install -q ./client </dev/null          # respool-client, from this repository
# --no-deps: zenml is pinned above, and respool-client comes from this repository, not an index.
"$VENV/bin/pip" install -q --no-deps ./integrations/zenml </dev/null
"$VENV/bin/python" -c 'import zenml, respool_zenml.store; print("zenml", zenml.__version__, "+ respool_zenml ready")'
