"""The rdma transport and the choice of transport (docs/rdma.md), as a user meets them with real processes.

No machine here has an RDMA device, so what runs here is: what the host offers (`slotstream transports`, checked
against UCX's own `ucx_info -d`), the clear error of `--transport rdma` without a device (CLI), auto between two
processes of one host that cannot share memory (another IPC namespace, another user, a sender whose UCX has no
shared memory) reaching the receiver over tcp and saying why, which transports keep each protocol's receiver
passive (`protocols --json`), and `scripts/rdma-check.sh` saying there is nothing to check. Moving data over an
RDMA NIC is what scripts/rdma-check.sh checks on hardware.
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import BIN, REPO, parse_finished, wait_until

RDMA_TLS = re.compile(r"Transport:\s*(rc_verbs|rc_mlx5|dc_mlx5|ud_verbs|ud_mlx5)\b")


def run(*args, env=None, timeout=20):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=env)


def ucx_rdma_transports():
    """The RDMA transports UCX's own tool lists on this host (an independent view of the devices); None without
    ucx_info."""
    if shutil.which("ucx_info") is None:
        return None
    out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=30).stdout
    return set(RDMA_TLS.findall(out))


def host_has_rdma():
    tls = ucx_rdma_transports()
    return bool(tls) if tls is not None else os.path.isdir("/sys/class/infiniband") and bool(
        os.listdir("/sys/class/infiniband"))


needs_no_rdma = pytest.mark.skipif(host_has_rdma(), reason="this host has an RDMA device: the no-device error "
                                                           "cannot happen (scripts/rdma-check.sh checks rdma)")


@pytest.mark.deadline(30)
def test_transports_lists_every_transport_and_agrees_with_ucx_info():
    p = run("transports", "--json")
    assert p.returncode == 0, p.stderr
    listed = {t["name"]: t for t in json.loads(p.stdout)}
    assert list(listed) == ["shm", "tcp", "rdma", "udp"]
    for name, t in listed.items():
        assert isinstance(t["available"], bool) and t["why"], (name, t)
    assert listed["shm"]["available"] and listed["tcp"]["available"] and listed["udp"]["available"]
    tls = ucx_rdma_transports()
    if tls is None:
        pytest.skip("ucx_info (ucx-utils) is not installed: nothing to compare with")
    assert listed["rdma"]["available"] == bool(tls), (listed["rdma"], tls)
    offered = {tl for port in listed["rdma"]["ports"] for tl in port["ucx_transports"]}
    assert offered == tls, "the UCX transports per port are UCX's own"
    # The text form says the same, one line per transport.
    text = run("transports").stdout.splitlines()
    assert [line.split()[0:2] for line in text if not line.startswith(" ")] == [
        [n, "yes" if t["available"] else "no"] for n, t in listed.items()]


@needs_no_rdma
@pytest.mark.deadline(30)
def test_rdma_without_a_device_is_a_usage_error_within_two_seconds(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out")
    for argv in (["send", "--to", rx.addr, "--transport", "rdma", "--synthetic", "0:25:64x64x3", "--duration", "1"],
                 ["recv", "--listen", "127.0.0.1:0", "--out", str(tmp_path / "x"), "--transport", "rdma"],
                 ["bench-peer", "send", "--to", rx.addr, "--transport", "rdma", "--size", "64", "--count", "5"],
                 ["bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", "rdma"]):
        t0 = time.monotonic()
        p = run(*argv)
        took = time.monotonic() - t0
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert took < 2.0, f"{argv[0:2]} took {took:.2f} s"
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, f"one line, not {lines}"
        assert "no RDMA device" in lines[0] and "--transport tcp" in lines[0], lines[0]
        assert "listening on" not in p.stdout, "nothing half-started"
    time.sleep(0.2)
    assert "refused" not in rx.stderr.text and rx.stdout.lines[1:] == [], "the sender never reached the receiver"
    # A receiver that allows rdma among others (auto) starts and serves without it.
    p = run("send", "--to", rx.addr, "--synthetic", "0:25:64x64x3", "--duration", "0.2")
    assert p.returncode == 0 and "slotstream send: transport shm: " in p.stderr, p.stderr


@pytest.mark.deadline(30)
def test_rdma_options_with_a_transport_they_do_not_apply_to_are_usage_errors(tmp_path):
    for argv in (["send", "--to", "127.0.0.1:1", "--transport", "tcp", "--rdma-device", "mlx5_0:1", "--synthetic",
                  "0:25:64x64x3", "--duration", "1"],
                 ["recv", "--listen", "127.0.0.1:0", "--out", str(tmp_path), "--transport", "shm", "--rdma-transport",
                  "dc"],
                 ["recv", "--listen", "127.0.0.1:0", "--out", str(tmp_path), "--transport", "udp", "--rdma-device",
                  "mlx5_0:1"]):
        p = run(*argv)
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert "rdma" in p.stderr, p.stderr
    p = run("send", "--to", "127.0.0.1:1", "--rdma-transport", "xrc", "--synthetic", "0:25:64x64x3", "--duration", "1")
    assert p.returncode == 2 and "--rdma-transport" in p.stderr, p.stderr


def synthetic_send(addr, name, *prefix, env=None, transport="auto"):
    """`send` of 10 synthetic 64x64x3 frames, started through `prefix` (unshare, setpriv) if given."""
    argv = [*prefix, BIN, "send", "--to", addr, "--name", name, "--transport", transport, "--synthetic",
            "0:50:64x64x3", "--duration", "0.2"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


# Where shared memory cannot be used, auto's next choice: tcp here; rdma or tcp on a host with an RDMA device
# (rdma when the sender also offers it, e.g. its locked-memory limit allows).
NOT_SHM = "(rdma|tcp)" if host_has_rdma() else "tcp"


def finished_over(rx, name):
    _, line = rx.stdout.wait_for(rf"^sender {name} finished: ", 20)
    assert parse_finished(line)["messages"] == 10, line
    assert re.search(rf" transport={NOT_SHM} ", line), line


def can_run(*argv):
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.deadline(60)
def test_auto_sender_in_another_ipc_namespace_reaches_the_receiver_over_tcp_and_says_why(receiver, tmp_path):
    if not can_run("unshare", "--ipc", "true"):
        pytest.skip("unshare --ipc is not permitted here")
    rx = receiver("--out", tmp_path / "out")
    p = synthetic_send(rx.addr, "ipc", "unshare", "--ipc")
    assert p.returncode == 0, p.stderr
    assert re.search(rf"slotstream send: transport {NOT_SHM}( \(rc\))?: no shm \(the sender runs in another IPC "
                     r"namespace", p.stderr), p.stderr
    assert "UCX  ERROR" not in p.stderr, "shm was never tried"
    finished_over(rx, "ipc")
    # The same sender asking for shm outright is refused with the reason, nothing half-set-up.
    p = synthetic_send(rx.addr, "ipc2", "unshare", "--ipc", transport="shm")
    assert p.returncode == 1 and "transport shm cannot be used: the sender runs in another IPC namespace" in p.stderr


@pytest.mark.deadline(60)
def test_auto_sender_run_as_another_user_reaches_the_receiver_over_tcp_and_says_why(receiver, tmp_path):
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    if os.geteuid() != 0 or not can_run(*nobody, "true"):
        pytest.skip("needs root and setpriv to run a sender as another user")
    if not can_run(*nobody, "test", "-x", BIN):
        pytest.skip(f"user 65534 cannot run {BIN}")
    rx = receiver("--out", tmp_path / "out")
    p = synthetic_send(rx.addr, "nobody", *nobody)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"slotstream send: transport {NOT_SHM}( \(rc\))?: no shm \(the sender runs as another user",
                     p.stderr), p.stderr
    assert "Permission denied" not in p.stderr, "shm was never tried"
    finished_over(rx, "nobody")


@pytest.mark.deadline(60)
def test_auto_sender_whose_shared_memory_set_up_fails_tells_the_receiver_and_falls_back_to_tcp(receiver, tmp_path):
    # The host and the shm domain match, so the receiver chooses shm; the sender's UCX is told to use no
    # shared-memory device, so its shm endpoint cannot be made: a set-up that fails anyway.
    rx = receiver("--out", tmp_path / "out")
    p = synthetic_send(rx.addr, "noshm", env=dict(os.environ, UCX_SHM_DEVICES="none"))
    assert p.returncode == 0, p.stderr
    line = [s for s in p.stderr.splitlines() if s.startswith("slotstream send: transport ")]
    assert len(line) == 1, p.stderr
    assert re.match(rf"slotstream send: transport shm failed \(.+\), then {NOT_SHM}( \(rc\))?: no shm \(the sender's shm set-up "
                    r"failed\)", line[0]), line[0]
    finished_over(rx, "noshm")
    # The receiver was told why, and released the first connection before the second came.
    wait_until(lambda: "the sender could not set up transport shm" in rx.stderr.text, 5, "the sender's reason")
    assert "already connected" not in rx.stderr.text, rx.stderr.text
    # With shm asked for outright there is nothing to fall back to: the error, exit 1.
    p = synthetic_send(rx.addr, "noshm2", env=dict(os.environ, UCX_SHM_DEVICES="none"), transport="shm")
    assert p.returncode == 1 and "ucp_ep_create" in p.stderr, p.stderr


@pytest.mark.deadline(30)
def test_protocols_say_on_which_transports_the_receiver_is_passive():
    p = run("protocols", "--json")
    assert p.returncode == 0, p.stderr
    protocols = {e["name"]: e for e in json.loads(p.stdout) if e["engine"] == "ucx"}  # the datagram ones: udp
    keys = {"shm", "tcp", "rdma:rc", "rdma:dc", "rdma:ud"}
    for name, e in protocols.items():
        on = e["receiver_progress_on"]
        assert set(on) == keys, (name, on)
        # The transport's own need (tcp: the fabric's puts; ud: UCX's emulated RMA) or the protocol's.
        assert on["tcp"] and on["rdma:ud"], name
        for k in ("shm", "rdma:rc", "rdma:dc"):
            assert on[k] == e["receiver_progress"], (name, k)
    assert not any(protocols["status_byte"]["receiver_progress_on"][k] for k in ("shm", "rdma:rc", "rdma:dc"))
    assert "passive receiver on: rdma:dc, rdma:rc, shm" in run("protocols").stdout


@needs_no_rdma
@pytest.mark.deadline(30)
def test_rdma_check_says_there_is_nothing_to_check_here():
    p = subprocess.run(["bash", str(REPO / "scripts" / "rdma-check.sh")], capture_output=True, text=True, timeout=20,
                       env=dict(os.environ, SLOTSTREAM_BIN=BIN), stdin=subprocess.DEVNULL)
    assert p.returncode == 77, (p.returncode, p.stdout, p.stderr)
    out = (p.stdout + p.stderr).strip().splitlines()
    assert len(out) == 1 and "no RDMA device" in out[0], out


@pytest.mark.deadline(240)
def test_rdma_check_runs_every_step_in_its_dry_run_over_shared_memory(tmp_path):
    # The hardware check cannot run here (tests/rdma runs it on Soft-RoCE); its mechanics can: the same steps over shm
    # (ucx_perftest, the bench's latency and throughput, a bench-peer pair whose receiver must make no progress call,
    # the content runs checked by `slotstream verify`, the verdict).
    p = subprocess.run(["bash", str(REPO / "scripts" / "rdma-check.sh")], capture_output=True, text=True, timeout=230,
                       env=dict(os.environ, SLOTSTREAM_BIN=BIN, RDMA_CHECK_TRANSPORT="shm", RDMA_CHECK_TINY="1",
                                RDMA_CHECK_LONG_SECONDS="2", OUT=str(tmp_path / "check")), stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^ucp_put_bw 1048576 +2000 ", out, re.M), out
    for protocol in ("status_byte", "sliding_window", "credit"):
        assert re.search(rf"^{protocol} +256 B +[\d.]+ MB/s \(3 blocks\) +[\d.]+x ucx_perftest put_bw$", out, re.M), out
        assert re.search(rf"^{protocol} +256 B +p50 +[\d.]+ us +[\d.]+x ucx_perftest put_lat$", out, re.M), out
    assert "status_byte receiver over shm: 2000 messages, progress_calls 0" in out, out
    m = re.search(r"^content: (\d+) of (\d+) messages verified", out, re.M)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 0, out
    for name in ("mib", "multi-a", "multi-b", "long"):
        assert re.search(rf"^  {name}: transport shm", out, re.M), out
    assert out.strip().splitlines()[-1] == ("VERDICT: PASS: rdma moves data one-sided with a passive status-byte "
                                            "receiver (DRY RUN over shm: this checks the script, not rdma)")
