"""deploy/k8s/ stays true to the server and the image, checked without a cluster: the manifests
parse, the probes ask the server's real routes on the image's port, the pods get the whole drain
before they are killed, run as the image's user with a GPU and the voices volume at the image's
voices directory, and the Service, the PodDisruptionBudget and the RayService find what they
need."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from chorus.server.app import create_app
from chorus.server.config import ServerConfig
from chorus.server.main import UVICORN_GRACE_MARGIN_S
from chorus.server.registry import ModelRegistry

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def _documents() -> dict[str, dict]:
    """Every manifest under deploy/k8s by its kind (one of each)."""
    by_kind: dict[str, dict] = {}
    for path in sorted(K8S.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] not in by_kind, f"two {document['kind']} manifests"
            by_kind[document["kind"]] = document
    return by_kind


DOCS = _documents()
POD = DOCS["Deployment"]["spec"]["template"]
CONTAINER = POD["spec"]["containers"][0]


def _image_env() -> dict[str, str]:
    """The ENV settings of the Containerfile's final stage."""
    text = (ROOT / "Containerfile").read_text().replace("\\\n", " ")
    final = text[text.rindex("\nFROM "):]
    env_lines = re.findall(r"^ENV (.+)$", final, re.MULTILINE)
    return dict(pair.split("=", 1) for line in env_lines for pair in line.split())


def _image_uid() -> int:
    return int(re.search(r"^USER (\d+)$", (ROOT / "Containerfile").read_text(), re.MULTILINE).group(1))


def _get_routes() -> set[str]:
    app = create_app(ModelRegistry(ServerConfig(), load=None))
    return {route.path for route in app.routes if "GET" in getattr(route, "methods", ())}


def _port_number(container: dict, port) -> int:
    """A probe's or a Service's port (a name or a number) as the container's port number."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def _env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def test_the_manifests_are_a_deployment_service_budget_claim_and_rayservice():
    assert set(DOCS) == {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim", "RayService"}
    for document in DOCS.values():
        assert document["apiVersion"] and document["metadata"]["name"]


def test_the_probes_ask_the_servers_routes_on_the_images_port():
    routes, port = _get_routes(), int(_image_env()["CHORUS_PORT"])
    probes = {kind: CONTAINER[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/ready" and probes["livenessProbe"]["path"] == "/health"
    for kind, probe in probes.items():
        assert probe["path"] in routes, (kind, probe["path"])
        assert _port_number(CONTAINER, probe["port"]) == port, kind


def test_the_grace_period_covers_the_pre_stop_and_the_whole_drain():
    pre_stop = CONTAINER["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(_env(CONTAINER).get("CHORUS_SHUTDOWN_GRACE_S", ServerConfig().shutdown_grace_s))
    needed = float(pre_stop[1]) + drain + UVICORN_GRACE_MARGIN_S
    assert POD["spec"]["terminationGracePeriodSeconds"] >= needed


def test_the_pod_runs_as_the_images_user_with_a_gpu_and_the_voices_volume():
    security = POD["spec"]["securityContext"]
    assert security["runAsUser"] == security["fsGroup"] == _image_uid() and security["runAsNonRoot"]
    assert CONTAINER["resources"]["limits"]["nvidia.com/gpu"] == "1"
    mounts = {m["name"]: m["mountPath"] for m in CONTAINER["volumeMounts"]}
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    assert mounts["voices"] == _image_env()["CHORUS_VOICES_DIR"]
    claim = DOCS["PersistentVolumeClaim"]
    assert volumes["voices"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every replica writes the one library


def test_the_service_and_the_budget_select_the_deployments_pods():
    labels = POD["metadata"]["labels"]
    assert DOCS["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service, budget = DOCS["Service"]["spec"], DOCS["PodDisruptionBudget"]["spec"]
    assert service["selector"].items() <= labels.items()
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert all(_port_number(CONTAINER, port["targetPort"]) for port in service["ports"])
    assert budget["maxUnavailable"] < DOCS["Deployment"]["spec"]["replicas"]


def test_the_rayservice_runs_chorus_image_with_the_voices_claim():
    cluster = DOCS["RayService"]["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [group["template"] for group in cluster["workerGroupSpecs"]]
    repository = CONTAINER["image"].rsplit(":", 1)[0]
    routes = _get_routes()
    serve = yaml.safe_load(DOCS["RayService"]["spec"]["serveConfigV2"])
    voices_dir = serve["applications"][0]["args"]["voices_dir"]
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["image"].rsplit(":", 1)[0] == repository
        assert pod["spec"]["securityContext"]["fsGroup"] == _image_uid()
        assert {"name": "voices", "mountPath": voices_dir} in container["volumeMounts"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]]
        assert claims == [DOCS["PersistentVolumeClaim"]["metadata"]["name"]]
        for kind in ("readinessProbe", "livenessProbe"):
            if kind in container:
                assert container[kind]["httpGet"]["path"] in routes
