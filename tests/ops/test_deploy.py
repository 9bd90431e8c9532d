"""deploy/: the Dockerfile, compose.yaml and the Kubernetes manifests parse and say what
docs/deploy.md says they do. There is no Docker engine or cluster here: the manifests are checked
against the Kubernetes JSON schemas (kubernetes-validate, strict), compose.yaml by structure (and
by ``docker compose config`` when a Docker CLI with compose is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import Settings, SettingsError

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30.0"


def _k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _k8s_docs() if d["kind"] == kind}


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert kustomization["namespace"] == "respool"
    assert kustomization["images"][0]["name"] == "respool"


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _k8s_docs()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "Secret", "Job", "Deployment", "Deployment", "Service",
         "PodDisruptionBudget"]
    )  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_api_deployment_probes_security_and_wiring() -> None:
    api = _by_kind("Deployment")["respool-api"]
    assert api["spec"]["replicas"] >= 2
    pod = _pod_spec(api)
    (container,) = pod["containers"]
    assert container["command"] == ["respool"] and container["args"] == ["serve"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    _assert_non_root(pod, container)
    _assert_config_refs(container)

    labels = api["spec"]["template"]["metadata"]["labels"]
    assert api["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (service,) = _by_kind("Service").values()
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", 8080)
    (pdb,) = _by_kind("PodDisruptionBudget").values()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < api["spec"]["replicas"]


def test_reconciler_and_migration_job() -> None:
    rec = _by_kind("Deployment")["respool-reconciler"]
    (container,) = _pod_spec(rec)["containers"]
    assert container["args"] == ["reconcile"]
    _assert_non_root(_pod_spec(rec), container)
    _assert_config_refs(container)

    (job,) = _by_kind("Job").values()
    (container,) = _pod_spec(job)["containers"]
    assert [*container["command"], *container["args"]] == ["respool", "db", "migrate"]
    assert _pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")
    _assert_non_root(_pod_spec(job), container)
    _assert_config_refs(container)
    images = {c["image"] for d in _k8s_docs() if "template" in d.get("spec", {})
              for c in _pod_spec(d)["containers"]}  # fmt: skip
    assert images == {"respool"}  # one image, set by kustomization.yaml


def test_configmap_and_secret_hold_valid_settings() -> None:
    env = dict(_by_kind("ConfigMap")["respool-config"]["data"])
    env |= _by_kind("Secret")["respool-secrets"]["stringData"]
    assert all(k.startswith("RESPOOL_") for k in env)
    with pytest.raises(SettingsError):  # the example token is refused
        Settings.from_env(env)
    settings = Settings.from_env(env | {"RESPOOL_ADMIN_TOKEN": "t" * 32})  # the rest is valid
    assert settings.host == "0.0.0.0" and settings.auth_enabled and settings.admin_token
    assert settings.log_format == "json" and settings.retention == 30 * 86400


def _assert_non_root(pod: dict[str, Any], container: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]


def _assert_config_refs(container: dict[str, Any]) -> None:
    refs = {next(iter(r)): r[next(iter(r))]["name"] for r in container["envFrom"]}
    assert refs == {"configMapRef": "respool-config", "secretRef": "respool-secrets"}


# --- compose ---------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def test_compose_services() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "migrate", "api", "reconciler", "agent"}
    agent = services["agent"]  # docs/jobs.md: opt-in, unprivileged, its token from the env
    assert agent["command"][:2] == ["agent", "--node"] and agent["profiles"] == ["agent"]
    assert agent["user"] != "root" and not agent["user"].startswith("0")
    assert agent["environment"]["RESPOOL_TOKEN"].startswith("${")
    assert agent["healthcheck"] == {"disable": True}

    pg = services["postgres"]
    major = int(re.fullmatch(r"postgres:(\d+)(?:[.-].*)?", pg["image"]).group(1))  # type: ignore[union-attr]
    assert major >= 16
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])

    assert services["api"]["deploy"]["replicas"] == 2
    assert services["api"]["command"] == ["serve"]
    assert services["reconciler"]["command"] == ["reconcile"]
    assert services["reconciler"].get("deploy", {}).get("replicas", 1) == 1
    assert services["migrate"]["command"] == ["db", "migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "reconciler"):
        svc = services[name]
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("migrate", "api", "reconciler"):
        svc = services[name]
        assert svc["env_file"] == ".env"
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert "@postgres:5432/" in svc["environment"]["RESPOOL_DATABASE_URL"]
    # Containers without HTTP must not inherit the image's /healthz check.
    assert services["reconciler"]["healthcheck"] == {"disable": True}
    assert services["migrate"]["healthcheck"] == {"disable": True}


def test_env_example_covers_compose_and_is_valid() -> None:
    env: dict[str, str] = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    text = (DEPLOY / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert required <= env.keys(), required - env.keys()
    settings = {k: v for k, v in env.items() if k.startswith("RESPOOL_")}
    with pytest.raises(SettingsError):  # the example token is refused
        Settings.from_env(settings)
    Settings.from_env(settings | {"RESPOOL_ADMIN_TOKEN": "t" * 32})


def test_docker_compose_config_when_available(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI here; the structure test above checks compose.yaml")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("docker CLI without the compose plugin")
    env = tmp_path / ".env"
    env.write_text((DEPLOY / ".env.example").read_text())
    result = subprocess.run(
        [docker, "compose", "-f", str(DEPLOY / "compose.yaml"), "--env-file", str(env),
         "config", "-q"],
        capture_output=True, text=True, check=False, cwd=DEPLOY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


# --- Dockerfile, Grafana ---------------------------------------------------------------------


def test_dockerfile_is_multi_stage_non_root_with_healthcheck() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.MULTILINE)
    assert len(stages) >= 2 and stages[-1][1] == "runtime"
    assert "COPY --from=build" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK .*\n?.*/healthz", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["respool"\]', text, re.MULTILINE)
    assert re.search(r"^EXPOSE 8080", text, re.MULTILINE)


def test_grafana_dashboard_is_importable_json() -> None:
    doc = json.loads((DEPLOY / "grafana" / "respool.json").read_text())
    assert doc["title"] == "respool" and doc["uid"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"


def test_systemd_unit_runs_the_agent_unprivileged_and_stops_it_with_sigterm() -> None:
    """deploy/systemd/respool-agent.service (docs/jobs.md, "As an unprivileged user"): the agent
    of this host's node, as its own user, its token from a root-only file, stopped by SIGTERM
    with time to stop its jobs, restarted when it dies."""
    fields: dict[str, str] = {}
    for line in (DEPLOY / "systemd" / "respool-agent.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            fields[key.strip()] = value.strip()
    assert fields["ExecStart"].split()[1:4] == ["agent", "--node", "%H"]
    assert fields["User"] not in ("root", "0") and fields["EnvironmentFile"].startswith("/etc/")
    assert (fields["KillSignal"], fields["KillMode"]) == ("SIGTERM", "mixed")
    assert int(fields["TimeoutStopSec"]) >= 30 and fields["Restart"] == "always"
