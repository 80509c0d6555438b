"""The Kubernetes manifests (deploy/kubernetes) validate offline and keep what a receiver node needs.

No cluster and no kubectl are needed: every plain manifest is checked against the Kubernetes 1.33
schemas with `kubernetes-validate --strict` (installed by scripts/setup.sh into build/tools-venv).
Where kubectl happens to be installed, the Kustomize renderings are validated as well.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml  # python3-yaml, installed by scripts/setup.sh

from conftest import BIN, REPO

K8S_VERSION = "1.33.0"
MANIFESTS = REPO / "deploy" / "kubernetes"
VENV_TOOL = REPO / "build" / "tools-venv" / "bin" / "kubernetes-validate"
IMAGE = "localhost/slotstream:latest"  # what `make image` (deploy/image/build.sh) names it
RDMA = "rdma/hca_shared_devices_a"


def validator():
    """The kubernetes-validate command: build/tools-venv, PATH, or the module in this Python."""
    if VENV_TOOL.exists():
        return [str(VENV_TOOL)]
    found = shutil.which("kubernetes-validate")
    if found:
        return [found]
    if subprocess.run([sys.executable, "-c", "import kubernetes_validate"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "kubernetes_validate"]
    pytest.fail("kubernetes-validate is missing: run `bash scripts/setup.sh` "
                "(it installs it from PyPI into build/tools-venv)")


def validate(*files):
    return subprocess.run([*validator(), "--strict", "-k", K8S_VERSION, *map(str, files)],
                          capture_output=True, text=True, timeout=300)


def manifest_files():
    """Every Kubernetes manifest; kustomization.yaml files are Kustomize's, not Kubernetes objects."""
    return sorted(f for f in MANIFESTS.rglob("*.yaml") if f.name != "kustomization.yaml")


def documents():
    docs = {}
    for f in manifest_files():
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def pod(kind, name):
    return documents()[(kind, name)]["spec"]["template"]["spec"]


def receiver():
    return pod("DaemonSet", "slotstream-receiver")


def worker():
    return pod("StatefulSet", "slotstream-worker")


def option(args, name):
    """The value of `--name VALUE` or `--name=VALUE` in a container's args."""
    for i, a in enumerate(args):
        if a == name:
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


# ------------------------------------------------------------------------------ schemas

def test_every_manifest_validates_strictly():
    files = manifest_files()
    assert len(files) >= 5, files
    p = validate(*files)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("passed") >= len(files), p.stdout


def test_strict_validation_catches_a_misspelt_field(tmp_path):
    # Proves the validator is not vacuous: an unknown field in a pod spec must fail.
    bad = tmp_path / "bad.yaml"
    d = documents()[("DaemonSet", "slotstream-receiver")]
    d["spec"]["template"]["spec"]["hostNetwrok"] = d["spec"]["template"]["spec"].pop("hostNetwork")
    bad.write_text(yaml.safe_dump(d))
    p = validate(bad)
    assert p.returncode != 0, p.stdout + p.stderr


def kustomizations():
    return sorted(MANIFESTS.rglob("kustomization.yaml"))


def test_kustomizations_list_every_manifest():
    listed = set()
    for k in kustomizations():
        spec = yaml.safe_load(k.read_text())
        assert spec["kind"] in ("Kustomization", "Component"), k
        for r in spec.get("resources", []):
            target = (k.parent / r).resolve()
            assert target.exists(), f"{k}: resource {r} does not exist"
            if target.is_file():
                listed.add(target)
    assert listed == {f.resolve() for f in manifest_files()}


def kustomize(directory):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: the Kustomize rendering is not checked (the plain manifests are)")
    p = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "unknown command" in p.stderr:
        pytest.skip(f"this kubectl cannot render Kustomize: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    return p.stdout


def rendered(directory, tmp_path):
    """Kustomize's output for a directory, validated strictly; its objects by (kind, name)."""
    text = kustomize(directory)
    out = tmp_path / "rendered.yaml"
    out.write_text(text)
    v = validate(out)
    assert v.returncode == 0, v.stdout + v.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}
    for d in docs.values():
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "slotstream", d["metadata"]["name"]
        assert d["metadata"].get("namespace", "slotstream") == "slotstream"
    return docs


def test_kustomize_base_renders_and_validates(tmp_path):
    docs = rendered(MANIFESTS, tmp_path)
    assert sorted(k for k, _ in docs) == ["ConfigMap", "DaemonSet", "Namespace", "Service", "StatefulSet"]


def test_kustomize_worker_overlay_renders_one_more_pair(tmp_path):
    docs = rendered(MANIFESTS / "examples" / "workers-edge-c-on-edge-d", tmp_path)
    (sts,) = docs.values()
    assert sts["metadata"]["name"] == "slotstream-worker-edge-c-on-edge-d"
    assert sts["spec"]["replicas"] == 8
    assert sts["spec"]["selector"]["matchLabels"]["slotstream.io/sender"] == "edge-c"
    spec = sts["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["kubernetes.io/hostname"] == "edge-d"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["SLOTSTREAM_SENDER"] == "edge-c"
    # Still only its own device, read-only.
    data = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}["streams"]
    assert data["readOnly"] is True and "$(SLOTSTREAM_DEVICE)" in data["subPathExpr"]


def test_kustomize_tcp_only_component(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(MANIFESTS, overlay)  # kustomize refuses absolute paths
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{base}/components/tcp-only]\n")
    docs = rendered(overlay, tmp_path)
    cm = docs[("ConfigMap", "slotstream")]["data"]
    assert cm["SLOTSTREAM_TRANSPORT"] == "auto" and cm["SLOTSTREAM_RDMA_DEVICE"] == ""
    # No RDMA device: no --rdma-device at all (the wrapper passed `--rdma-device ""` before).
    argv = receiver_argv(docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]["containers"][0], cm)
    assert argv[0] == "recv" and option(argv, "--transport") == "auto", argv
    assert "--rdma-device" not in argv and "" not in argv, argv
    assert "UCX_TLS" not in cm and "UCX_IB_GID_INDEX" not in cm
    rx = docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]
    assert rx["nodeSelector"] == {"slotstream.io/receiver": "true"}
    res = rx["containers"][0]["resources"]
    assert RDMA not in res["requests"] and RDMA not in res["limits"]
    assert rx["hostNetwork"] is True


# ----------------------------------------------------------------------- the receiver

def test_receiver_has_what_rdma_needs():
    rx = receiver()
    assert rx["hostNetwork"] is True
    assert rx["nodeSelector"]["slotstream.io/rdma"] == "true"
    c = rx["containers"][0]
    # Pinned memory comes from the locked-memory limit, which the wrapper raises and logs; an
    # unprivileged process needs no capability for it (and would get none from `add`).
    assert "ulimit -l unlimited" in c["command"][2]
    assert c["resources"]["requests"][RDMA] == 1
    assert c["resources"]["limits"][RDMA] == 1  # extended resources: request == limit
    vols = {v["name"]: v for v in rx["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert vols["dshm"]["emptyDir"]["sizeLimit"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"


def receiver_argv(container, configmap):
    """What the receiver container execs with a ConfigMap's environment: its args with $(VAR) expanded as
    Kubernetes does, through its /bin/sh wrapper (with the binary replaced by a printer of its arguments)."""
    args = [re.sub(r"\$\((\w+)\)", lambda m: configmap.get(m.group(1), m.group(0)), a) for a in container["args"]]
    script = container["command"][2].replace("exec /usr/local/bin/slotstream", "printf '%s\\n'")
    assert script != container["command"][2], "the wrapper no longer execs /usr/local/bin/slotstream"
    env = {"PATH": os.environ["PATH"], **configmap}
    p = subprocess.run(["/bin/sh", "-c", script, *container["command"][3:], *args], capture_output=True, text=True,
                       timeout=30, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_receiver_runs_recv_with_the_expected_options():
    c = receiver()["containers"][0]
    assert c["image"] == IMAGE
    assert c["imagePullPolicy"] == "IfNotPresent"
    args = c["args"]
    assert args[0] == "recv"
    assert option(args, "--listen") == "0.0.0.0:7000"
    assert option(args, "--out") == "/data/streams"
    assert option(args, "--metrics") == "0.0.0.0:9100"
    # The transport and RDMA device come from the ConfigMap: rdma on RDMA nodes (the tcp-only
    # component makes it auto), never UCX_TLS, which would replace slotstream's choice everywhere.
    assert option(args, "--transport") == "$(SLOTSTREAM_TRANSPORT)"
    cm = documents()[("ConfigMap", "slotstream")]["data"]
    assert cm["SLOTSTREAM_TRANSPORT"] == "rdma" and cm["SLOTSTREAM_RDMA_DEVICE"] == "mlx5_0:1"
    argv = receiver_argv(c, cm)
    assert option(argv, "--transport") == "rdma" and option(argv, "--rdma-device") == "mlx5_0:1", argv
    assert "UCX_TLS" not in cm
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"control": 7000, "metrics": 9100}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": 9100}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 9100}


def test_receiver_requires_a_token_and_bounds_its_memory():
    """Senders must authenticate, and all their blocks together fit the pod's shared memory and memory limit."""
    rx = receiver()
    c = rx["containers"][0]
    token = option(c["args"], "--token-file")
    assert token, "the receiver serves any sender: no --token-file"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in rx["volumes"]}
    mount = next((m for m in mounts.values() if token.startswith(m["mountPath"].rstrip("/") + "/")), None)
    assert mount and mount.get("readOnly"), f"{token} is not on a read-only mount"
    assert vols[mount["name"]]["secret"]["secretName"], "the token does not come from a Secret"
    budget = option(c["args"], "--max-memory")
    assert budget, "no --max-memory: one hello can ask for more memory than the pod has"
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}

    def size(text):
        m = re.fullmatch(r"(\d+)([KMG]i?)?B?", text)
        assert m, f"unexpected size {text!r}"
        return int(m.group(1)) * units.get(m.group(2) or "", 1)

    assert size(budget) < size(vols["dshm"]["emptyDir"]["sizeLimit"]), "budget does not fit the shared memory"
    assert size(budget) < size(c["resources"]["limits"]["memory"]), "budget does not fit the memory limit"


def test_receiver_command_and_options_work_with_this_binary():
    """The wrapper passes the args to slotstream, and every option exists in `recv --help`."""
    c = receiver()["containers"][0]
    assert c["command"][:2] == ["/bin/sh", "-c"]
    script = c["command"][2].replace("/usr/local/bin/slotstream", BIN)
    p = subprocess.run(["/bin/sh", "-c", script, *c["command"][3:], "recv", "--help"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "memlock soft=" in p.stderr
    for a in c["args"]:
        if a.startswith("--"):
            assert re.search(rf"(^|[\s,]){re.escape(a.split('=')[0])}\b", p.stdout), f"recv has no option {a}"


def test_receiver_stores_on_the_node():
    rx = receiver()
    c = rx["containers"][0]
    vols = {v["name"]: v for v in rx["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols["streams"]["hostPath"]["path"] == "/var/lib/slotstream/streams"
    assert mounts["streams"]["mountPath"] == option(c["args"], "--out")
    assert not mounts["streams"].get("readOnly", False)
    # The workers' progress: read (never written) by the receiver, for back-pressure and clean-up.
    assert vols["workers"]["hostPath"]["path"] == "/var/lib/slotstream/workers"
    assert mounts["workers"]["mountPath"] == option(c["args"], "--worker-dir")
    assert mounts["workers"]["readOnly"] is True


# ------------------------------------------------------------------------- the workers

def test_workers_mount_only_their_device_read_only():
    w = worker()
    c = w["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in w["volumes"]}
    # Same node directories as the receiver's.
    rx_vols = {v["name"]: v for v in receiver()["volumes"]}
    assert vols["streams"]["hostPath"]["path"] == rx_vols["streams"]["hostPath"]["path"]
    assert vols["workers"]["hostPath"]["path"] == rx_vols["workers"]["hostPath"]["path"]
    data = mounts["streams"]
    assert data["readOnly"] is True
    assert data["subPathExpr"] == "$(SLOTSTREAM_SENDER)/device-$(SLOTSTREAM_DEVICE)"
    assert data["mountPath"] == env["SLOTSTREAM_DEVICE_DIR"]["value"]
    progress = mounts["workers"]
    assert not progress.get("readOnly", False)
    assert progress["subPathExpr"] == "$(SLOTSTREAM_SENDER)/worker-$(SLOTSTREAM_DEVICE)"
    assert progress["mountPath"] == env["SLOTSTREAM_WORKER_DIR"]["value"]
    # The device number is the pod's ordinal.
    assert env["SLOTSTREAM_DEVICE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert c["image"] == IMAGE and c["imagePullPolicy"] == "IfNotPresent"
    assert w["shareProcessNamespace"] is True  # the shell is not PID 1: SIGTERM stops it


def test_worker_scripts_exist_in_the_repository():
    for w in [worker()]:
        for a in w["containers"][0]["args"]:
            if a.startswith("/opt/slotstream/workers/"):
                assert (REPO / "workers" / a.rsplit("/", 1)[1]).exists(), a


def test_worker_wrapper_waits_for_data_then_runs_the_worker(tmp_path):
    c = worker()["containers"][0]
    script = c["command"][2].replace("/data/device", str(tmp_path / "device")) \
                            .replace("/data/worker", str(tmp_path / "worker"))
    (tmp_path / "device").mkdir()
    (tmp_path / "worker").mkdir()
    p = subprocess.Popen(["/bin/sh", "-c", script, "worker", "echo", "started"], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1.5)  # no message yet: still waiting
        (tmp_path / "device" / "0000000000.bin").write_bytes(b"x")
        out, _ = p.communicate(timeout=5)
        assert out.strip() == "started"
    finally:
        p.kill()


# --------------------------------------------------------------------- everything else

def pod_specs():
    for (kind, name), d in documents().items():
        if kind in ("DaemonSet", "StatefulSet", "Deployment", "Job"):
            yield name, d["spec"]["template"]["spec"]


def test_every_container_is_hardened():
    """seccomp RuntimeDefault, no privilege escalation, read-only root, every capability dropped; the
    long-running containers as the image's unprivileged user, and the only root step an init container
    that may do nothing but chown the node directories the kubelet created."""
    for name, spec in pod_specs():
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        pod = {k: v for k, v in spec["securityContext"].items() if k in ("runAsNonRoot", "runAsUser")}
        for c in spec["containers"]:
            sc = {**pod, **c["securityContext"]}  # the container's settings win over the pod's
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, f"{name}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), c["name"]
        for c in spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}, f"{name}/{c['name']}"
            assert c["command"][0] == "chown", c["command"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True



def test_every_container_has_requests_and_limits():
    for (kind, name), d in documents().items():
        if kind not in ("DaemonSet", "StatefulSet", "Deployment", "Job"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][section]), f"{name}/{c['name']} {section}"


def test_every_object_is_labelled_and_selectors_match():
    for (kind, name), d in documents().items():
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "slotstream", name
        if "template" in d.get("spec", {}):
            selector = d["spec"]["selector"]["matchLabels"]
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), name


def test_service_and_configmap_tell_senders_where_receivers_are():
    docs = documents()
    svc = docs[("Service", "slotstream-receivers")]["spec"]
    assert svc["clusterIP"] == "None"
    rx_labels = docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["metadata"]["labels"]
    assert svc["selector"].items() <= rx_labels.items()
    assert {p["port"] for p in svc["ports"]} == {7000, 9100}
    cm = docs[("ConfigMap", "slotstream")]["data"]
    assert re.fullmatch(r"[\w.-]+:\d+(,[\w.-]+:\d+)+", cm["SLOTSTREAM_RECEIVERS"]), cm["SLOTSTREAM_RECEIVERS"]
    refs = [e["configMapRef"]["name"] for e in receiver()["containers"][0]["envFrom"]]
    assert "slotstream" in refs


def test_image_build_uses_the_hosts_apt_mirror(tmp_path):
    """deploy/image/build.sh takes its Debian mirror from this host's apt configuration (a site with its own
    mirror or proxy builds from it), deb.debian.org only when apt names none, and MIRROR above both."""
    script = (REPO / "deploy" / "image" / "build.sh").read_text()
    func = re.search(r"^host_mirror\(\) \{.*?^\}", script, re.S | re.M).group(0)
    pick = re.search(r"^mirror=\$\{MIRROR:-\$\(host_mirror\)\}\nmirror=.*$", script, re.M).group(0)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\ncat \"$FAKE_APT\"\n")
    (fake / "apt-get").chmod(0o755)

    def mirror(apt_output, env_mirror=None):
        listing = tmp_path / "listing"
        listing.write_text(apt_output)
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", FAKE_APT=str(listing))
        env.pop("MIRROR", None)
        if env_mirror:
            env["MIRROR"] = env_mirror
        return subprocess.run(["bash", "-c", f"{func}\n{pick}\necho $mirror"], capture_output=True, text=True,
                              env=env, timeout=10).stdout.strip()

    own = ("http://security.example/debian-security/ bookworm-security main Packages\n"
           "http://mirror.example.org/debian/ bookworm main Packages\n")
    assert mirror(own) == "http://mirror.example.org/debian"
    assert mirror("") == "http://deb.debian.org/debian"
    assert mirror(own, "http://override.example/debian") == "http://override.example/debian"


def test_kustomize_platform_component_adds_a_three_member_etcd_and_registers_the_receivers(tmp_path):
    # An overlay beside the base, as the component's comment says (Kustomize wants relative paths).
    shutil.copytree(MANIFESTS, tmp_path / "kubernetes")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../kubernetes"], "components": ["../kubernetes/components/platform"]}))
    docs = rendered(overlay, tmp_path)
    etcd = docs[("StatefulSet", "slotstream-etcd")]
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("slotstream-etcd-") == 2 * 3  # three members, each named and addressed
    assert docs[("Service", "slotstream-etcd")]["spec"]["clusterIP"] == "None"
    # Every receiver registers on the platform that the ConfigMap names, with all three members.
    recv = docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert recv[recv.index("--platform") + 1] == "$(SLOTSTREAM_PLATFORM)"
    url = docs[("ConfigMap", "slotstream")]["data"]["SLOTSTREAM_PLATFORM"]
    assert url.startswith("etcd://") and url.count(":2379") == 3
    # The options exist in this build.
    help_text = subprocess.run([BIN, "recv", "--help"], capture_output=True, text=True).stdout
    for option in ("--platform", "--capacity-cpu"):
        assert option in help_text


def test_the_token_is_readable_by_the_unprivileged_receiver():
    rx = receiver()
    vols = {v["name"]: v for v in rx["volumes"]}
    user = rx["containers"][0]["securityContext"]["runAsUser"]
    assert rx["securityContext"]["fsGroup"] == user, "the token's files must belong to the receiver's group"
    assert vols["token"]["secret"]["defaultMode"] & 0o040, "group-readable"


# ------------------------------------------------------------------------------ the Helm chart

CHART = REPO / "deploy" / "helm" / "slotstream"
EXAMPLE_VALUES = CHART / "ci" / "edge-cluster-values.yaml"
TCP_PLATFORM_VALUES = CHART / "ci" / "tcp-platform-values.yaml"
VALUE_SETS = [[], [EXAMPLE_VALUES], [TCP_PLATFORM_VALUES]]
VALUE_IDS = ["defaults", "edge-cluster", "tcp-platform"]
HELM_TOOL = REPO / "build" / "tools-bin" / "helm"
MONITORING = {"ServiceMonitor", "PrometheusRule"}  # Prometheus Operator CRDs: no schema in kubernetes-validate


def helm(*args):
    tool = str(HELM_TOOL) if HELM_TOOL.exists() else shutil.which("helm")
    if not tool:
        pytest.fail("helm is missing: run `bash scripts/setup.sh` (it builds helm from the Go module proxy into "
                    "build/tools-bin)")
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)


def render(tmp_path, *values):
    args = ["template", "slotstream", CHART, "--namespace", "edge"]
    for v in values:
        args += ["-f", v]
    p = helm(*args)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "rendered.yaml"
    out.write_text(p.stdout)
    return [d for d in yaml.safe_load_all(p.stdout) if d]


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_chart_lints(values):
    args = ["lint", "--strict", CHART]
    for v in values:
        args += ["-f", v]
    p = helm(*args)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_chart_renders_objects_that_validate(tmp_path, values):
    docs = render(tmp_path, *values)
    plain = [d for d in docs if d["kind"] not in MONITORING]
    f = tmp_path / "plain.yaml"
    f.write_text(yaml.safe_dump_all(plain))
    p = validate(f)
    assert p.returncode == 0 and "passed" in p.stdout, p.stdout + p.stderr
    kinds = sorted(d["kind"] for d in docs)
    if values == [TCP_PLATFORM_VALUES]:
        assert kinds == ["DaemonSet", "Deployment", "Secret", "Service"], kinds
    elif values:
        assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "PrometheusRule", "Service", "ServiceMonitor",
                         "StatefulSet", "StatefulSet"], kinds
    else:
        assert kinds == ["DaemonSet", "Secret", "Service"], kinds
    for d in docs:
        assert d["metadata"]["namespace"] == "edge" and d["metadata"]["labels"]["app.kubernetes.io/part-of"] == \
            "slotstream", d["metadata"]["name"]


def pod_specs_of(docs):
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("DaemonSet", "StatefulSet", "Deployment")]


def test_chart_pods_are_hardened_and_run_this_version(tmp_path):
    docs = render(tmp_path, EXAMPLE_VALUES)
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split()[1]
    for name, spec in pod_specs_of(docs):
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, f"{name}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}, f"{name}/{c['name']}: {sc['capabilities']}"
            assert c["image"] == f"localhost/slotstream:{version}", c["image"]
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]) and {"cpu", "memory"} <= set(
                c["resources"]["requests"])
        for c in spec.get("initContainers", []):
            assert c["command"][0] == "chown" and c["securityContext"]["capabilities"] == {
                "drop": ["ALL"], "add": ["CHOWN"]}, f"{name}/{c['name']}"


def test_chart_version_is_cmakes():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    cmake = re.search(r"project\(slotstream VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text()).group(1)
    assert chart["version"] == cmake and chart["appVersion"] == cmake, chart


def test_chart_commands_exist_in_this_binary(tmp_path):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(tmp_path, EXAMPLE_VALUES)}
    rx = docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]["containers"][0]
    tx = docs[("Deployment", "slotstream-sender-edge-a")]["spec"]["template"]["spec"]["containers"][0]
    for args in (rx["args"], tx["args"]):
        help_text = subprocess.run([BIN, args[0], "--help"], capture_output=True, text=True).stdout
        for a in args[1:]:
            if a.startswith("--"):
                assert re.search(rf"(^|[\s,]){re.escape(a)}\b", help_text), f"{args[0]} has no option {a}"
    assert option(tx["args"], "--to") == "edge-b.example:7000,edge-c.example:7000"
    assert rx["readinessProbe"]["httpGet"]["path"] == "/ready" and rx["livenessProbe"]["httpGet"]["path"] == "/health"
    workers = [d for (k, _), d in docs.items() if k == "StatefulSet"]
    assert sorted(w["spec"]["replicas"] for w in workers) == [12, 12]
    h264 = next(w for w in workers if "edge-b" in w["metadata"]["name"])["spec"]["template"]["spec"]
    assert h264["containers"][0]["args"] == ["sh", "/opt/slotstream/workers/h264.sh"]
    assert h264["nodeSelector"] == {"kubernetes.io/hostname": "edge-b"}


def test_chart_defaults_to_auto_and_serves_rdma_behind_one_switch(tmp_path):
    """By default (no RDMA assumed: the defaults named mlx5_0:1 and GID 3): --transport auto, no device, no RDMA
    resource, no GID. receiver.rdma.enabled: --transport rdma, the RDMA resource, and the device and GID given, as
    the kustomize base on RDMA nodes; never UCX_TLS (it would replace slotstream's own transport choice)."""
    def receiver(*values, sets=()):
        args = ["template", "slotstream", CHART]
        for v in values:
            args += ["-f", v]
        for kv in sets:
            args += ["--set", kv]
        p = helm(*args)
        assert p.returncode == 0, p.stderr
        docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(p.stdout) if d}
        return docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]
    for spec in (receiver(), receiver(TCP_PLATFORM_VALUES)):
        rx = spec["containers"][0]
        assert option(rx["args"], "--transport") == "auto" and "--rdma-device" not in rx["args"], rx["args"]
        assert RDMA not in rx["resources"]["limits"] and RDMA not in rx["resources"]["requests"]
        assert not {e["name"] for e in rx.get("env") or []} & {"UCX_IB_GID_INDEX", "UCX_TLS"}, rx.get("env")
        assert spec["nodeSelector"] == {"slotstream.io/receiver": "true"} and "tolerations" not in spec
    # The switch alone: rdma on any port, the resource, no GID (InfiniBand needs none).
    rx = receiver(sets=["receiver.rdma.enabled=true"])["containers"][0]
    assert option(rx["args"], "--transport") == "rdma" and "--rdma-device" not in rx["args"], rx["args"]
    assert rx["resources"]["limits"][RDMA] == 1 and rx["resources"]["requests"][RDMA] == 1
    assert "UCX_IB_GID_INDEX" not in {e["name"] for e in rx.get("env") or []}
    # A whole RoCE cluster: device and GID.
    spec = receiver(EXAMPLE_VALUES)
    rx = spec["containers"][0]
    assert option(rx["args"], "--transport") == "rdma" and option(rx["args"], "--rdma-device") == "mlx5_0:1"
    assert "--rdma-transport" not in rx["args"] and "--platform" not in rx["args"]
    assert RDMA in rx["resources"]["limits"]
    env = {e["name"]: e["value"] for e in rx["env"]}
    assert env.get("UCX_IB_GID_INDEX") == "3" and "UCX_TLS" not in env, env
    assert spec["nodeSelector"] == {"slotstream.io/rdma": "true"}
    # An explicit transport wins over the switch's default.
    rx = receiver(sets=["receiver.rdma.enabled=true", "receiver.transport=auto"])["containers"][0]
    assert option(rx["args"], "--transport") == "auto" and RDMA in rx["resources"]["limits"]


def test_chart_platform_registers_receivers_and_schedules_senders(tmp_path):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(tmp_path, TCP_PLATFORM_VALUES)}
    rx = docs[("DaemonSet", "slotstream-receiver")]["spec"]["template"]["spec"]["containers"][0]
    tx = docs[("Deployment", "slotstream-sender-gateway")]["spec"]["template"]["spec"]["containers"][0]
    url = yaml.safe_load(TCP_PLATFORM_VALUES.read_text())["platform"]["url"]
    assert option(rx["args"], "--platform") == url and option(rx["args"], "--capacity-cpu") == "4"
    assert option(tx["args"], "--platform") == url and "--to" not in tx["args"]
    for args in (rx["args"], tx["args"]):  # every option exists in this binary
        help_text = subprocess.run([BIN, args[0], "--help"], capture_output=True, text=True).stdout
        for a in args[1:]:
            if a.startswith("--"):
                assert re.search(rf"(^|[\s,]){re.escape(a)}\b", help_text), f"{args[0]} has no option {a}"
    p = helm("template", "slotstream", CHART, "--set", "platform.enabled=true")
    assert p.returncode != 0 and "platform.url" in p.stderr, p.stderr


def monitoring(tmp_path):
    docs = render(tmp_path, EXAMPLE_VALUES)
    rules = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]["groups"][0]["rules"]
    dashboard = json.loads((CHART / "files" / "slotstream-dashboard.json").read_text())
    exprs = [r["expr"] for r in rules] + [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return rules, dashboard, exprs


def test_alerts_cover_what_the_issue_asks_and_are_well_formed(tmp_path):
    rules, dashboard, _ = monitoring(tmp_path)
    names = {r["alert"] for r in rules}
    assert {"SlotstreamGaps", "SlotstreamBacklogHigh", "SlotstreamDevicePaused", "SlotstreamWorkerRestarts",
            "SlotstreamRefusedConnections"} <= names, names
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"], r
        assert r["expr"].count("(") == r["expr"].count(")") and r["expr"].count("{") == r["expr"].count("}"), r
    assert dashboard["uid"] == "slotstream" and len(dashboard["panels"]) >= 10
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.deadline(90)
def test_every_metric_the_alerts_and_dashboard_use_is_exported(tmp_path, receiver):
    """Every slotstream_* and process_* name in the rules and the dashboard is on a real receiver's /metrics (run
    with a worker, an accepted sender and a refused one, so that every family has samples)."""
    _, _, exprs = monitoring(tmp_path)
    used = set()
    for e in exprs:
        used |= set(re.findall(r"\b((?:slotstream|process)_[a-z_]+)", e))
    token = tmp_path / "token"
    token.write_text("t\n")
    rx = receiver("--out", tmp_path / "out", "--worker", "sh " + str(REPO / "workers" / "checksum.sh"),
                  "--metrics", "127.0.0.1:0", "--token-file", token)
    from conftest import metrics_address, run_send, send_argv, wait_until
    import urllib.request
    url = f"http://{metrics_address(rx)}/metrics"
    run_send(rx.addr, "--name", "intruder", "--file", "0=/etc/hostname", check=False)
    # Some series exist only while a sender is connected (held blocks, paused devices, connection info).
    cam = subprocess.Popen(send_argv(rx.addr, "--name", "cam", "--token-file", token, "--synthetic", "0:25:16x16x3",
                                     "--duration", "4"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        scrape = lambda: urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: E731
        # Per-device series appear once a device has carried data (issue 19), not at the hello.
        wait_until(lambda: all(m in scrape() for m in ("slotstream_worker_processed_total{", "slotstream_active_senders 1",
                                                       "slotstream_messages_total{")), 20,
                   "a live sender that has sent, and its worker")
        text = scrape()
    finally:
        cam.wait(30)
    exported = set(re.findall(r"^([a-z_]+)(?:\{| )", text, re.M))
    missing = {u for u in used if u not in exported}
    assert not missing, f"used by alerts or the dashboard but not exported: {sorted(missing)}"


# ------------------------------------------------------------------------------ systemd

UNIT = REPO / "deploy" / "systemd" / "slotstream-recv.service.in"  # cmake --install writes it (test_install.py)


def test_systemd_unit_verifies_and_pins_memory(tmp_path):
    text = UNIT.read_text()
    assert re.search(r"^LimitMEMLOCK=infinity$", text, re.M)
    assert re.search(r"^User=slotstream$", text, re.M) and re.search(r"^NoNewPrivileges=yes$", text, re.M)
    exec_start = re.search(r"^ExecStart=(\S+) (.*)$", text, re.M)
    args = exec_start.group(2).split()
    help_text = subprocess.run([BIN, args[0], "--help"], capture_output=True, text=True).stdout
    for a in args[1:]:
        if a.startswith("--"):
            assert a in help_text, f"recv has no option {a}"
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (package systemd): the unit's syntax is not checked")
    unit = tmp_path / "slotstream-recv.service"
    unit.write_text(text.replace(exec_start.group(1), BIN))  # verify checks the binary exists
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
