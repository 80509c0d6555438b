"""The Kubernetes manifests validate offline and keep what a receiver node needs."""
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import REPO

MANIFESTS = REPO / "deploy" / "kubernetes"
VENV_TOOL = REPO / "build" / "tools-venv" / "bin" / "kubernetes-validate"


def validator():
    if VENV_TOOL.exists():
        return str(VENV_TOOL)
    found = shutil.which("kubernetes-validate")
    if not found:
        pytest.fail("kubernetes-validate is missing: run scripts/setup.sh (it installs it into build/tools-venv)")
    return found


def documents():
    import yaml  # python3-yaml, installed by scripts/setup.sh
    docs = {}
    for f in sorted(MANIFESTS.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for d in yaml.safe_load_all(f.read_text()):
            docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def test_every_manifest_validates_strictly():
    files = [str(f) for f in sorted(MANIFESTS.glob("*.yaml")) if f.name != "kustomization.yaml"]
    assert len(files) >= 5
    p = subprocess.run([validator(), "--strict", "-k", "1.33.0", *files], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_kustomization_lists_every_manifest():
    import yaml
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(k["resources"])
    present = {f.name for f in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_receiver_has_what_rdma_needs():
    rx = documents()[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]
    assert rx["hostNetwork"] is True
    c = rx["containers"][0]
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    assert c["resources"]["requests"]["rdma/hca_shared_devices_a"] == 1
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["image"] == "localhost/slotstream:latest"
    assert any(a.startswith("--metrics=") for a in c["args"])
    vols = {v["name"]: v for v in rx["volumes"]}
    assert vols["streams"]["hostPath"]["path"] == "/var/lib/slotstream/streams"
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"


def test_workers_mount_their_data_read_only():
    w = documents()[("StatefulSet", "slotstream-worker")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in w["containers"][0]["volumeMounts"]}
    assert mounts["streams"]["readOnly"] is True
    assert not mounts["workers"].get("readOnly", False)
    assert w["containers"][0]["resources"]["limits"]["memory"]
