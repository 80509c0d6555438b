"""`slotstream bench datagram|loss|apps`: tiny runs produce well-formed records, figures and report sections.
Benchmarks measure; nothing here asserts a speed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, REPO

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # the one with matplotlib


def bench(tmp_path, experiment, *extra, timeout=120):
    out = tmp_path / experiment
    p = subprocess.run([BIN, "bench", experiment, "--tiny", "--out", str(out), *extra], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["errors"] == []
    return out, doc, p.stdout


def replot(out):
    """bench/plot.py --report on a run's results: it succeeds; returns the report."""
    r = subprocess.run([PYTHON, str(REPO / "bench" / "plot.py"), str(out / "results.json"), "--report"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return (out / "report.md").read_text()


@pytest.mark.deadline(150)
def test_datagram_experiment(tmp_path):
    out, doc, log = bench(tmp_path, "datagram")
    assert "[datagram " in log and "left]" in log
    recs = doc["records"]
    for p, t in (("write_record", "udp"), ("dgram_send", "udp"), ("dgram_rd", "udp"), ("dgram_rc", "tcp")):
        got = {r["metric"] for r in recs if r["protocol"] == p and r["transport"] == t}
        assert {"latency_p50", "latency_mean", "throughput", "delivered_fraction"} <= got, (p, got)
    assert any(r["metric"] == "latency_p50_vs_dgram_rc" and r["protocol"] == "write_record" for r in recs)
    # At 0 % loss on loopback every message sent was complete at the receiver.
    assert all(r["value"] == 1.0 for r in recs if r["metric"] == "delivered_fraction")
    for png in ("fig_dgram_latency.png", "fig_dgram_throughput.png"):
        assert (out / png).stat().st_size > 1000, png
    report = replot(out)
    assert "## Datagram RDMA over UDP" in report and "Patent:" in report and "write_record / dgram_rc" in report


@pytest.mark.deadline(150)
def test_loss_experiment(tmp_path):
    out, doc, log = bench(tmp_path, "loss")
    if "skipped" in log:
        pytest.skip("the loss experiment needs root (network namespaces, nftables): " + log.strip()[-200:])
    recs = doc["records"]
    levels = {r["variant"] for r in recs if r["experiment"] == "loss"}
    assert levels == {"loss 0%", "loss 5%"}, levels
    fractions = {(r["protocol"], r["variant"]): r["value"] for r in recs if r["metric"] == "valid_fraction"}
    # Reliable services deliver every byte at any loss; nothing delivers more than was sent.
    assert fractions[("dgram_rd", "loss 5%")] == 1.0 and fractions[("dgram_rc", "loss 5%")] == 1.0
    assert all(0 <= v <= 1 for v in fractions.values())
    measured = [r["value"] for r in recs if r["metric"] == "loss_measured" and r["variant"] == "loss 5%"]
    assert measured and 0 < measured[0] < 0.2
    for png in ("fig_dgram_loss_goodput.png", "fig_dgram_loss_valid.png"):
        assert (out / png).stat().st_size > 1000, png


def test_apps_is_left_out_of_tiny_runs(tmp_path):
    _, doc, log = bench(tmp_path, "apps")
    assert doc["records"] == [] and "not part of tiny runs" in log


def test_bench_help_lists_the_datagram_experiments():
    p = subprocess.run([BIN, "bench", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    for exp in ("datagram", "loss", "apps"):
        assert exp in p.stdout


@pytest.mark.deadline(90)
def test_shimloss_experiment(tmp_path):
    """Large datagrams through the socket shim under 5 % nftables loss: every datagram sent is whole, partial or
    lost, and the theory beside it is (1-p)^segments."""
    out, doc, log = bench(tmp_path, "shimloss")
    if "skipped" in log:
        pytest.skip("shimloss needs root (network namespaces, nftables): " + log.strip()[-200:])
    recs = {r["metric"]: r["value"] for r in doc["records"] if r["experiment"] == "shimloss"}
    assert recs["datagrams_sent"] == 100 and recs["segments_per_datagram"] == 12  # 16 KiB in 1,440-byte segments
    assert abs(recs["whole_fraction"] + recs["partial_fraction"] + recs["lost_fraction"] - 1) < 1e-9
    assert all(0 <= recs[m] <= 1 for m in ("whole_fraction", "partial_fraction", "lost_fraction"))
    assert recs["whole_theory"] == pytest.approx(0.95 ** 12)
    assert 0 < recs["loss_measured"] < 0.2
    report = replot(out)
    assert (out / "fig_shim_loss.png").stat().st_size > 1000
    assert "socket shim under loss" in report


@pytest.mark.deadline(90)
def test_shimperf_experiment(tmp_path):
    """iperf3 UDP with and without the shim, in a namespace: both measured, the ratio recorded (no speed asserted)."""
    import shutil
    if not shutil.which("iperf3"):
        pytest.skip("iperf3 is not installed (scripts/setup.sh installs it)")
    out, doc, log = bench(tmp_path, "shimperf")
    if "skipped" in log:
        pytest.skip("shimperf needs root (network namespaces): " + log.strip()[-200:])
    got = {(r["transport"], r["metric"]) for r in doc["records"] if r["experiment"] == "shimperf"}
    assert {("udp+shim", "iperf3_received"), ("udp", "iperf3_received"), ("udp+shim", "iperf3_received_vs_plain")} <= got
    assert all(r["value"] > 0 for r in doc["records"] if r["metric"] == "iperf3_received")
    # iperf3's CPU accounting, per Gbit: both ends, with and without, and the shim's as a multiple of plain.
    for t in ("udp+shim", "udp"):
        assert {(t, "iperf3_sender_cpu"), (t, "iperf3_receiver_cpu")} <= got
    assert ("udp+shim", "iperf3_sender_cpu_vs_plain") in got
    assert all(r["value"] > 0 for r in doc["records"] if r["metric"].endswith("_cpu"))


@pytest.mark.deadline(60)
def test_sipscale_experiment(tmp_path):
    """SIPp with 50 clients (tiny), a socket each: every call open at once at the plateau, memory measured there for
    UDP through the shim, UDP and TCP, and every call successful. Nothing here compares the amounts."""
    import shutil
    if not shutil.which("sipp"):
        pytest.skip("sipp is not installed (scripts/setup.sh installs sip-tester)")
    out, doc, log = bench(tmp_path, "sipscale")
    if "skipped" in log:
        pytest.skip("sipscale reads /proc/slabinfo, which needs root: " + log.strip()[-200:])
    recs = {(r["transport"], r["metric"]): r["value"] for r in doc["records"] if r["experiment"] == "sipscale"}
    assert {r["size_bytes"] for r in doc["records"] if r["experiment"] == "sipscale"} == {50}
    for t in ("udp+shim", "udp", "tcp"):
        assert recs[(t, "calls_open")] == 50, t  # sipp's statistics at the plateau: all 50 calls open at once
        assert recs[(t, "calls_successful")] == 50 and recs[(t, "calls_failed")] == 0, t
        assert recs[(t, "uac_sockets")] >= 50, t  # a socket per client
        assert recs[(t, "rss_uac_kib")] > 0 and recs[(t, "rss_uas_kib")] > 0, t
        assert recs[(t, "memory_kib")] == pytest.approx(recs[(t, "rss_uac_kib")] + recs[(t, "rss_uas_kib")] +
                                                        recs[(t, "slab_kib")]), t
        assert recs[(t, "memory_kib")] > 0 and recs[(t, "sip_response_p50")] >= 0, t
    # The server answers every UDP client on its one socket, and accepts a TCP connection per client.
    assert recs[("udp", "uas_sockets")] < 10 and recs[("udp+shim", "uas_sockets")] < 10
    assert recs[("tcp", "uas_sockets")] >= 50
    assert ("udp+shim", "memory_saving_vs_tcp") in recs and ("udp", "memory_saving_vs_tcp") in recs
    report = replot(out)
    assert (out / "fig_sip_memory.png").stat().st_size > 1000
    assert "SIPp with a socket per client" in report


@pytest.mark.deadline(60)
def test_ffmpeg_streams_over_http(tmp_path):
    """bench apps' http mode (the patent's HTTP streaming): the sender serves with -listen 1, the receiver asks
    and decodes every frame, identical to a direct decode; the first frame comes after the request."""
    import shutil
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg is not installed (scripts/setup.sh installs it)")
    sys.path.insert(0, str(REPO / "bench"))
    import dgram_experiments as dx
    src, dst = dx.ffmpeg_urls("http", 8080)
    assert src.startswith("http://127.0.0.1:8080/") and dst == src  # what ffmpeg_once runs for this mode
    reference = dx.ffmpeg_reference(1)
    first_ms, decoded, identical = dx.ffmpeg_once("http", 1, reference)
    assert len(reference) == 25 and decoded == 25 and identical == 25
    assert first_ms > 0
