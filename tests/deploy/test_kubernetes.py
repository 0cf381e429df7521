"""deploy/kubernetes, checked as far as this machine can without a Kubernetes cluster: every object validates against
Kubernetes' own schemas (kubernetes-validate, strict: an unknown field is an error) and the RayCluster has what
KubeRay's CRD requires; every ``ray start`` and ``execspace`` command line in the manifests parses with the real
CLIs' parsers; the slots and the pods' security contexts say what docs/cluster.md says. Opt-in
(``EXECSPACE_TEST_KUBE_IMAGE=1``: the build takes minutes): the Dockerfile builds, and in its image, run with the
docker flags that stand for the worker pod's security context, the sandbox backend works, and without either
loosening it does not."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from execspace.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
#: Kubernetes versions the objects must validate for: user-namespaced pods on by default (1.33), and the newest
#: schemas kubernetes-validate ships.
VERSIONS = ("1.33",)
SLOT = "execspace_sandbox"


def objects() -> dict[str, dict[str, Any]]:
    """Every object of the manifests, by kind."""
    found = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert doc["kind"] not in found, f"{path.name}: a second {doc['kind']}"
            found[doc["kind"]] = doc
    return found


def raycluster() -> dict[str, Any]:
    return objects()["RayCluster"]


def worker_group() -> dict[str, Any]:
    (group,) = raycluster()["spec"]["workerGroupSpecs"]
    return dict(group)


def pod_templates() -> dict[str, dict[str, Any]]:
    """The pod templates: the RayCluster's head and workers, the front doors' Deployment."""
    spec = raycluster()["spec"]
    return {
        "head": spec["headGroupSpec"]["template"],
        "worker": worker_group()["template"],
        "frontdoor": objects()["Deployment"]["spec"]["template"],
    }


def test_the_manifests_hold_the_objects_docs_cluster_md_shows() -> None:
    assert sorted(objects()) == ["Deployment", "RayCluster", "Service"]
    assert raycluster()["apiVersion"] == "ray.io/v1"


@pytest.mark.parametrize("version", (*VERSIONS, "latest"))
def test_every_object_validates_against_kubernetes_schemas(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (the dev extra)")
    version = kv.latest_version() if version == "latest" else version
    for kind in ("Deployment", "Service"):
        kv.validate(objects()[kind], version, strict=True)
    # KubeRay's pod templates are core PodTemplateSpecs: checked as the template of a PodTemplate object
    for name, template in pod_templates().items():
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
        kv.validate(wrapped, version, strict=True)


def test_a_misspelt_field_is_refused_so_the_validation_is_real() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (the dev extra)")
    template = pod_templates()["worker"]
    context = template["spec"]["containers"][0]["securityContext"]
    context["procMnt"] = context.pop("procMount")
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"}, "template": template}
    with pytest.raises(kv.ValidationError, match="procMnt"):
        kv.validate(wrapped, VERSIONS[0], strict=True)


def test_the_raycluster_has_what_kuberays_crd_requires() -> None:
    """The required fields and types of ray.io/v1 RayCluster's schema (KubeRay's CRD, ray.io_rayclusters.yaml)."""
    spec = raycluster()["spec"]
    assert "template" in spec["headGroupSpec"]
    for group in spec["workerGroupSpecs"]:
        assert {"groupName", "minReplicas", "maxReplicas", "template"} <= set(group)
        assert isinstance(group["minReplicas"], int) and isinstance(group["maxReplicas"], int)
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    for params in [spec["headGroupSpec"]["rayStartParams"], *[g["rayStartParams"] for g in spec["workerGroupSpecs"]]]:
        assert all(isinstance(v, str) for v in params.values())  # the CRD: a map of strings


def test_ray_version_and_image_are_one_across_the_pods() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    found = re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M)
    assert found is not None
    assert raycluster()["spec"]["rayVersion"] == found.group(1)
    images = {c["image"] for t in pod_templates().values() for c in t["spec"]["containers"]}
    assert len(images) == 1 and images.pop().endswith(f":{found.group(1)}")


# -- the command lines ---------------------------------------------------------------------------------------


def kuberay_flags(params: dict[str, str]) -> list[str]:
    """``ray start``'s arguments as KubeRay makes them from rayStartParams (its convertParamMap): ``"true"`` is the
    bare flag, any other value ``--key=value`` pasted into the container's shell command line."""
    line = " ".join(f"--{k}" if v.lower() == "true" else f"--{k}={v}" for k, v in sorted(params.items()))
    return shlex.split(line)


def ray_start(argv: list[str]) -> dict[str, Any]:
    """The options ``ray start`` parses from ``argv`` (its own click command; nothing is started)."""
    pytest.importorskip("ray", reason="needs Ray (the ray extra)")
    from ray.scripts.scripts import start

    return dict(start.make_context("start", argv).params)


def frontdoor_commands() -> list[list[str]]:
    """The front door's shell script as its commands, the environment's values standing for the variables."""
    (container,) = pod_templates()["frontdoor"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    env = {e["name"]: e.get("value", "e2b_" + "0" * 40) for e in container["env"]}
    (script,) = container["args"]
    script = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], script)
    return [shlex.split(part) for part in script.split("&&")]


def test_ray_start_takes_the_head_and_worker_params_with_their_slots() -> None:
    spec = raycluster()["spec"]
    head = ray_start(["--head", *kuberay_flags(spec["headGroupSpec"]["rayStartParams"])])
    worker = ray_start(["--address=execspace-head-svc:6379", *kuberay_flags(worker_group()["rayStartParams"])])
    assert SLOT not in json.loads(head["resources"])  # Ray drops a 0: --max-sandboxes 0 gives it none
    assert head["num_cpus"] == 0
    assert json.loads(worker["resources"]) == {SLOT: 32}


def test_the_front_door_joins_as_a_node_of_no_slot_and_serves_with_options_execspace_takes() -> None:
    (joining, serving) = frontdoor_commands()
    assert joining[:2] == ["ray", "start"]
    node = ray_start(joining[2:])
    assert node["address"] == "execspace-head-svc:6379"
    assert SLOT not in json.loads(node["resources"]) and node["num_cpus"] == 0
    assert serving[:3] == ["exec", "execspace", "serve"]
    args = build_parser().parse_args(serving[2:])
    assert args.ray == "auto" and args.host == "0.0.0.0" and args.port == 3000
    # a node that declares no slot (the head, the front doors) holds none; workspaces are the workers' volume
    assert args.max_sandboxes == 0
    (mount,) = worker_group()["template"]["spec"]["containers"][0]["volumeMounts"]
    assert args.workspace_root == mount["mountPath"]
    service = objects()["Service"]["spec"]
    assert service["selector"] == pod_templates()["frontdoor"]["metadata"]["labels"]
    assert [p["targetPort"] for p in service["ports"]] == ["http"]


def test_the_api_key_comes_from_a_secret_never_the_manifest() -> None:
    (container,) = pod_templates()["frontdoor"]["spec"]["containers"]
    (key,) = [e for e in container["env"] if e["name"] == "E2B_API_KEY"]
    assert set(key) == {"name", "valueFrom"} and "secretKeyRef" in key["valueFrom"]
    text = "".join(p.read_text(encoding="utf-8") for p in DEPLOY.glob("*.yaml"))
    assert re.search(r"e2b_[0-9a-f]{8,}", text) is None and "kind: Secret" not in text


# -- what the pods need ----------------------------------------------------------------------------------------


def test_only_the_workers_loosen_the_security_context_and_only_as_bubblewrap_needs() -> None:
    for name, template in pod_templates().items():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
            assert "privileged" not in context and "add" not in context["capabilities"]
            loosened = {k: context.get(k) for k in ("procMount", "seccompProfile", "appArmorProfile") if k in context}
            if name == "worker":
                assert spec["hostUsers"] is False  # what procMount: Unmasked requires
                assert loosened == {
                    "procMount": "Unmasked",
                    "seccompProfile": {"type": "Unconfined"},
                    "appArmorProfile": {"type": "Unconfined"},
                }
            else:
                assert loosened == {} and spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


# -- the image, for real (opt-in) --------------------------------------------------------------------------------

IMAGE = "execspace-ray:kube-test"
KEY = "e2b_" + secrets.token_hex(20)


def docker_flags(template: dict[str, Any]) -> list[str]:
    """The ``docker run`` flags that stand for a pod template's security context (docker has no per-container user
    namespace: hostUsers: false has no flag, so the container shares the host's, which is less than the pod gets)."""
    spec = template["spec"]
    (container,) = spec["containers"]
    context = {**spec.get("securityContext", {}), **container["securityContext"]}
    flags = ["--user", str(context["runAsUser"])]
    flags += [f"--cap-drop={c}" for c in context["capabilities"]["drop"]]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if context.get("procMount") == "Unmasked":
        flags += ["--security-opt", "systempaths=unconfined"]
    if context.get("seccompProfile", {}).get("type") == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    if context.get("appArmorProfile", {}).get("type") == "Unconfined":
        flags += ["--security-opt", "apparmor=unconfined"]
    return flags


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.environ.get("EXECSPACE_TEST_KUBE_IMAGE") != "1":
        pytest.skip("building the image takes minutes: set EXECSPACE_TEST_KUBE_IMAGE=1 (a daemon that reaches PyPI)")
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("needs a running Docker daemon")
    # a daemon that cannot pull debian:bookworm-slim builds FROM a local image of Debian bookworm
    base = os.environ.get("EXECSPACE_TEST_KUBE_IMAGE_BASE", "debian:bookworm-slim")
    argv = ["docker", "build", "-q", "-f", str(DEPLOY / "Dockerfile"), "-t", IMAGE, "--build-arg", f"BASE={base}"]
    argv += ["--build-arg", "ENVIRONMENTS=", str(ROOT)]  # no environment: a run of the system python shows enough
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    try:
        yield IMAGE
    finally:
        subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True)


def sandbox_verdict(image: str, flags: list[str]) -> tuple[bool, str]:
    """What ``execspace doctor`` in the image says of the sandbox backend: usable, and why (or why not)."""
    done = subprocess.run(
        ["docker", "run", "--rm", *flags, image, "execspace", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    (sandbox,) = [b for b in json.loads(done.stdout)["backends"] if b["name"] == "sandbox"]
    return bool(sandbox["ok"]), str(sandbox["reason"])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_in_the_image_with_the_worker_pods_context_the_sandbox_works(image: str) -> None:
    flags = docker_flags(pod_templates()["worker"])
    ok, reason = sandbox_verdict(image, flags)
    assert ok, reason
    assert "without capabilities" in reason and "seccomp filter active" in reason
    with serving(image, flags) as url:
        from e2b import Sandbox

        key = {"api_url": url, "sandbox_url": url, "api_key": KEY}
        box = Sandbox.create("base", timeout=120, **key)
        try:
            done = box.commands.run("id -u; grep -E '^(CapEff|Seccomp):' /proc/self/status; echo kept > f; cat f")
            assert done.stdout.split() == ["1000", "CapEff:", "0000000000000000", "Seccomp:", "2", "kept"]
        finally:
            box.kill()


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    ("dropped", "refusal"),
    [
        ("systempaths=unconfined", "Can't mount proc"),  # a masked /proc: no new proc in a user namespace
        ("seccomp=unconfined", "new namespace"),  # the runtime's default profile: no unshare(CLONE_NEWUSER)
    ],
)
def test_without_either_loosening_the_sandbox_refuses_to_start(image: str, dropped: str, refusal: str) -> None:
    flags = docker_flags(pod_templates()["worker"])
    at = flags.index(dropped)
    ok, reason = sandbox_verdict(image, flags[: at - 1] + flags[at + 1 :])
    assert not ok and refusal in reason, reason


@contextlib.contextmanager
def serving(image: str, flags: list[str]) -> Iterator[str]:
    """``execspace serve`` in the image on a loopback port of this host, as the worker pods' node servers run."""
    argv = ["docker", "run", "-d", "--rm", *flags, "-p", "127.0.0.1::3000", image, "execspace", "serve"]
    argv += ["--host", "0.0.0.0", "--port", "3000", "--api-key", KEY, "--workspace-root", "/workspaces"]
    argv += ["--pool-size", "0", "--kernel-environment", "none", "--no-warm-kernels"]
    container = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    try:
        port = subprocess.run(["docker", "port", container, "3000"], capture_output=True, text=True, check=True)
        url = "http://" + port.stdout.split()[0]
        import httpx

        deadline = time.monotonic() + 60
        while not _healthy(httpx, url):
            assert time.monotonic() < deadline, "execspace serve in the image did not answer /health within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        subprocess.run(["docker", "stop", "-t", "10", container], capture_output=True)


def _healthy(httpx: Any, url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return bool(httpx.get(f"{url}/health", timeout=2).status_code == 200)
    return False
