"""The KubeRay manifests (deploy/kubernetes), rendered and validated offline: kustomize (kubectl's)
renders them; Kubernetes' own schemas (kubernetes-validate, strict: unknown fields fail) check the
Service, the claim and every pod template; KubeRay's RayCluster fields are checked against
`raycluster_v1.schema.json`. Then what the manifests promise: the Service reaches the gateway's
port, readiness comes from /health, every Ray pod mounts the model cache and shared memory, the
gateway's command is one `prismserve serve` accepts and joins the head's Ray, nobody runs as root."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from prismserve.cli import _build_parser

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = "1.32"  # a version kubernetes-validate ships strict schemas for
SCHEMA = json.loads((Path(__file__).parent / "raycluster_v1.schema.json").read_text())


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the kustomization (apt-get install kubectl)"
    out = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy" / "kubernetes")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(out)}


def pod_templates(cluster: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    return {"head": spec["headGroupSpec"]["template"]} | {
        group["groupName"]: group["template"] for group in spec["workerGroupSpecs"]
    }


def check_raycluster(cluster: dict) -> None:
    """Raise unless `cluster` is a RayCluster KubeRay's API and Kubernetes' schemas accept."""
    jsonschema.validate(cluster, SCHEMA)
    for name, template in pod_templates(cluster).items():
        as_pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name},
            "template": template,
        }
        kubernetes_validate.validate(as_pod_template, KUBERNETES, strict=True)


def test_every_resource_passes_the_kubernetes_and_kuberay_schemas(rendered):
    assert set(rendered) == {"Service", "PersistentVolumeClaim", "RayCluster"}
    for kind in ("Service", "PersistentVolumeClaim"):
        kubernetes_validate.validate(rendered[kind], KUBERNETES, strict=True)
    check_raycluster(rendered["RayCluster"])


@pytest.mark.parametrize(
    "breaks",
    [
        lambda c: c["spec"]["headGroupSpec"]["rayStartParams"].update({"num-gpus": 0}),  # not a string
        lambda c: c["spec"]["workerGroupSpecs"][0].update({"replica": 2}),  # a misspelt field
        lambda c: c["spec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update({"imagePull": "x"}),
        lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][1]["ports"][0].update(
            {"containerPort": "8000"}
        ),
    ],
    ids=["start-param-type", "unknown-field", "group-name", "container-field", "port-type"],
)
def test_the_checks_refuse_a_broken_cluster(rendered, breaks):
    broken = copy.deepcopy(rendered["RayCluster"])
    breaks(broken)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        check_raycluster(broken)


def containers(template: dict) -> dict[str, dict]:
    return {c["name"]: c for c in template["spec"]["containers"]}


def test_the_service_reaches_the_gateway_beside_rays_head_and_readiness_is_its_health(rendered):
    service, cluster = rendered["Service"], rendered["RayCluster"]
    # The labels KubeRay puts on the head pod of a cluster.
    assert service["spec"]["selector"] == {
        "ray.io/cluster": cluster["metadata"]["name"],
        "ray.io/node-type": "head",
    }
    gateway = containers(pod_templates(cluster)["head"])["gateway"]
    (target,) = [p["targetPort"] for p in service["spec"]["ports"]]
    assert target in {p["name"] for p in gateway["ports"]}
    for probe in ("startupProbe", "readinessProbe"):
        assert gateway[probe]["httpGet"] == {"path": "/health", "port": target}


def test_the_gateway_serves_on_the_heads_ray_with_a_command_prismserve_accepts(rendered):
    head = pod_templates(rendered["RayCluster"])["head"]
    gateway, ray_head = containers(head)["gateway"], containers(head)["ray-head"]
    script = gateway["args"][0]
    assert "until ray status --address 127.0.0.1:6379" in script  # waits for the head
    command = shlex.split(script.split("exec ", 1)[1].replace('"$MODEL"', "MODEL"))
    assert command[:2] == ["prismserve", "serve"]
    args = _build_parser().parse_args(command[1:])
    assert (args.address, args.host, args.port) == ("127.0.0.1:6379", "0.0.0.0", 8000)
    assert args.state.startswith("/models/")  # registered apps and plans outlive the container
    # A Ray driver beside the head: the same session folder and the same image.
    ray_tmp = {m["name"] for m in ray_head["volumeMounts"] if m["mountPath"] == "/tmp/ray"}
    assert ray_tmp and ray_tmp == {m["name"] for m in gateway["volumeMounts"] if m["mountPath"] == "/tmp/ray"}
    assert gateway["image"] == ray_head["image"]


def test_every_ray_pod_mounts_the_model_cache_and_shared_memory_and_runs_as_a_user(rendered):
    cluster = rendered["RayCluster"]
    claim = rendered["PersistentVolumeClaim"]["metadata"]["name"]
    images = set()
    for name, template in pod_templates(cluster).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True, name
        for container in template["spec"]["containers"]:
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            assert mounts["/models"]["persistentVolumeClaim"]["claimName"] == claim, name
            assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory", name  # slabs, vLLM's queues
            images.add(container["image"])
    assert len(images) == 1  # one image: the server's versions on every node (runtime/nodes.py)
    workers = cluster["spec"]["workerGroupSpecs"]
    assert all(
        int(containers(g["template"])["ray-worker"]["resources"]["limits"]["nvidia.com/gpu"]) for g in workers
    )
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
