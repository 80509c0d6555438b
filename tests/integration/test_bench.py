"""`slotstream bench`: a tiny run of every experiment produces well-formed records and plots.
Benchmarks measure; nothing here asserts a speed."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, PROTOCOLS, REPO

KEYS = {"experiment": str, "protocol": str, "transport": str, "size_bytes": int, "blocks": int, "metric": str,
        "value": float, "unit": str, "run": int, "repeat": int, "variant": str}
EXPERIMENTS = ["sync_latency", "latency", "throughput", "cpu", "resources", "held_block", "cameras", "idle"]
# Experiments with axes of their own carry them as further keys of their records.
DIMENSIONS = {"cache": {"devices": int, "process_ns_per_byte": float, "window_bytes": int, "window_of_cache": float},
              "fan_in_threads": {"senders": int}, "fan_in_round_robin": {"senders": int},
              "message_rate": {"devices": int}, "zero_copy": {"frame": str}}
FIGURES = ["fig10_sync_latency.png", "fig11_sync_distribution.png", "fig12_latency.png", "fig12_latency_median.png",
           "fig13_throughput_3_blocks.png", "fig15_cpu_sender_3_blocks.png", "fig15_cpu_receiver_3_blocks.png",
           "fig16_resources_sender.png", "fig17_resources_receiver.png", "fig18_held_block.png", "fig19_cameras.png",
           "fig19_cameras_equal_memory.png", "fig13_bytes_per_read_3_blocks.png", "fig_fan_in.png"]


@pytest.mark.deadline(300)  # every protocol in every experiment, twice: ~100 s on a quiet 2-core machine
def test_tiny_run_of_every_experiment(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run([BIN, "bench", "all", "--tiny", "--runs", "2", "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "[throughput " in p.stdout and "left]" in p.stdout, "no progress output with an ETA"
    doc = json.loads((out / "results.json").read_text())
    for key in ("host", "ucx", "slotstream", "command", "date", "settings"):
        assert doc["config"].get(key), key
    assert doc["errors"] == []
    for rec in doc["records"]:
        keys = dict(KEYS, **DIMENSIONS.get(rec["experiment"], {}))
        assert set(rec) == set(keys), rec
        for k, t in keys.items():
            assert isinstance(rec[k], t), (k, rec)
    transports = set(doc["config"]["settings"]["transports"])
    assert transports, "no transport found on this host"
    seen = {(r["experiment"], r["protocol"], r["transport"]) for r in doc["records"]}
    for t in transports:
        for exp in EXPERIMENTS:
            for proto in PROTOCOLS:  # every registered protocol is measured by default
                assert (exp, proto, t) in seen, f"{exp} has no record for {proto} on {t}"
        for exp in ("throughput", "latency"):
            assert (exp, "ucx_raw_put", t) in seen, f"{exp}: the UCX ceiling is missing on {t}"
    # The paper's own configurations beside ours (issue 22; --tiny: first run, first transport, one point each).
    first = doc["config"]["settings"]["transports"][0]
    for exp in ("held_block", "sync_latency", "cameras"):
        for variant in ("status_byte:policy=paper", "sliding_window:ack=thread"):
            assert (exp, variant, first) in seen, f"{exp}: the paper's {variant} is missing on {first}"
    if "tcp" in transports:
        for exp in ("throughput", "latency"):
            assert (exp, "tcp_socket", "tcp") in seen, f"{exp}: the plain TCP reference is missing"
    assert not any(p == "tcp_socket" and t != "tcp" for _, p, t in seen), "tcp_socket is listed under tcp only"
    metrics = {(r["experiment"], r["metric"]) for r in doc["records"]}
    for m in (("throughput", "throughput_ratio_to_ucx"), ("latency", "latency_mean_ratio_to_ucx"),
              ("cpu", "cpu_sender"), ("cpu", "cpu_receiver"), ("cameras", "throughput_cov"),
              ("cameras", "frame_jitter"), ("cameras", "frames_lost"), ("held_block", "throughput_during_hold"), ("throughput", "bytes_per_read"),
              ("fan_in_round_robin", "ratio_to_threads"), ("zero_copy", "frames_per_s"), ("zero_copy", "peak_rss"),
              ("zero_copy", "cpu_per_frame"), ("zero_copy", "sender_frames_per_s")):
        assert m in metrics, m
    assert all(r["unit"] == "MB/s" for r in doc["records"] if r["metric"] == "throughput")
    # The latency trace (bench-peer --trace on both peers) splits every slotstream protocol's latency
    # into its four stages and their total; the idle experiment measures both sides' CPU.
    for t in transports:
        for proto in PROTOCOLS:
            stages = {r["metric"] for r in doc["records"]
                      if (r["experiment"], r["protocol"], r["transport"]) == ("latency", proto, t)
                      and r["metric"].startswith("stage_")}
            want = {f"stage_{s}_mean" for s in ("fill", "post", "fabric_poll", "deliver", "total")}
            assert stages == want, (proto, t, stages)
            # --tiny times 20 messages after 5 untimed warm-up ones: the warm-up is sent and left out.
            samples = [r["value"] for r in doc["records"] if (r["experiment"], r["protocol"], r["transport"],
                                                               r["metric"]) == ("latency", proto, t, "latency_samples")]
            assert samples and all(v == 20 for v in samples), (proto, t, samples)
            idle = {r["metric"] for r in doc["records"] if (r["experiment"], r["protocol"], r["transport"]) ==
                    ("idle", proto, t)}
            assert idle == {"cpu_sender", "cpu_receiver"}, (proto, t, idle)
    assert "Where the time goes" in (out / "report.md").read_text()
    stages = [r for r in doc["records"] if r["metric"].startswith("stage_")]
    assert stages and all(r["value"] >= 0 for r in stages), [r for r in stages if r["value"] < 0]
    # cache (CARC): carc and credit on every transport, their receiver's processing measured, a figure each.
    for t in transports:
        for proto in ("carc", "credit"):
            cache = [r for r in doc["records"] if (r["experiment"], r["protocol"], r["transport"]) == ("cache", proto, t)]
            assert {r["metric"] for r in cache} >= {"throughput", "latency_p99", "read_ns_per_byte",
                                                  "max_unprocessed_bytes"}, (proto, t)
            assert all(r["value"] > 0 for r in cache if r["metric"] in ("throughput", "read_ns_per_byte")), cache
        assert (out / f"fig_cache_{t}_2_devices.png").stat().st_size > 1000
    assert all(r["value"] == 0 for r in doc["records"] if r["metric"] in ("frames_lost", "messages_lost"))
    # Two independent runs: every experiment measured in each.
    assert {r["run"] for r in doc["records"]} == {0, 1}
    for exp in EXPERIMENTS + ["fan_in_threads", "fan_in_round_robin", "message_rate"]:
        assert {r["run"] for r in doc["records"] if r["experiment"] == exp} == {0, 1}, exp
    # fan_in (buffered_read thesis): the thesis's protocol in both receiver modes on every transport.
    for t in transports:
        for exp in ("fan_in_threads", "fan_in_round_robin"):
            assert (exp, "buffered_read", t) in seen, f"{exp} has no record for buffered_read on {t}"
    # CPU: at most every core, on both sides (a figure above that is a measuring-window bug).
    cpu = [r for r in doc["records"] if r["unit"] == "% of one core"]
    assert {r["metric"] for r in cpu} >= {"cpu_sender", "cpu_receiver"}
    for r in cpu:
        assert 0 <= r["value"] <= 100 * os.cpu_count() * 1.02, r
    # One synchronisation metric for every protocol: the sender's wait for a free block.
    for t in transports:
        for proto in ("status_byte", "sliding_window"):
            waits = [r for r in doc["records"] if (r["experiment"], r["protocol"], r["transport"], r["metric"])
                     == ("sync_latency", proto, t, "sync_wait_p50")]
            assert waits and all(r["unit"] == "us" for r in waits), (proto, t)
    # The held-block run is the paper's situation: three blocks, saturated.
    assert {r["blocks"] for r in doc["records"] if r["experiment"] == "held_block"} == {3}
    # Cameras at slotstream's default and at equal memory for every protocol.
    assert {r["variant"] for r in doc["records"] if r["experiment"] == "cameras"} == {"per_connection", "equal_memory"}
    equal = {r["protocol"]: r["value"] for r in doc["records"]
             if r["experiment"] == "cameras" and r["variant"] == "equal_memory" and r["metric"] == "receiver_blocks_total"}
    assert len(set(equal.values())) == 1, f"equal-memory cameras do not have equal memory: {equal}"
    for png in FIGURES:
        assert (out / png).stat().st_size > 1000, png
    # message_rate (issue 21; --tiny measures status_byte with and without packing and the sliding window,
    # every protocol otherwise), UCX's put rate as the ceiling, on every transport; rates and their ratio to
    # the ceiling, a figure per transport; measured in both runs.
    tiny = {"status_byte", "status_byte:pack=off", "sliding_window"}
    for t in transports:
        rates = {r["protocol"]: r["value"] for r in doc["records"]
                 if (r["experiment"], r["transport"], r["metric"]) == ("message_rate", t, "message_rate")}
        for proto in tiny | {"ucx_perftest_put_bw"}:
            assert rates.get(proto, 0) > 0, f"message_rate has no rate for {proto} on {t}"
        ratios = {r["protocol"] for r in doc["records"]
                  if (r["experiment"], r["transport"], r["metric"]) == ("message_rate", t, "ratio_to_put_bw")}
        assert ratios == tiny, ratios
        per_unit = {r["protocol"]: r["value"] for r in doc["records"]
                    if (r["experiment"], r["transport"], r["metric"]) == ("message_rate", t, "records_per_unit")}
        assert per_unit["status_byte:pack=off"] == 1.0, "pack=off must send one message per block"
        assert (out / f"fig_message_rate_{t}.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "## Small messages per second" in report
    assert "## Targets" in report
    assert "–" in report and "[" in report, "no min–max ranges over the runs in the report"
    assert "## Cache-aware rate control" in report
    assert "## The paper's configuration beside ours" in report and "5.1 vs 70" in report
    for png in FIGURES:
        assert png in report, png

    # Anyone can re-plot from results.json alone.
    again = tmp_path / "replot"
    again.mkdir()
    shutil.copy(out / "results.json", again)
    r = subprocess.run([sys.executable, str(REPO / "bench" / "plot.py"), str(again / "results.json"), "--report"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (again / "report.md").exists() and (again / "fig19_cameras.png").exists()


def test_a_failing_peer_is_an_error_record_not_a_hang(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run([BIN, "bench", "resources", "--tiny", "--transport", "shm", "--protocols", "no_such_protocol",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    doc = json.loads((out / "results.json").read_text())
    assert doc["errors"] and "no_such_protocol" in doc["errors"][0]["what"]
    assert "sender peer failed" in doc["errors"][0]["error"]


def test_bench_help_lists_experiments():
    p = subprocess.run([BIN, "bench", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    for exp in EXPERIMENTS + ["all"]:
        assert exp in p.stdout


def test_bench_rejects_unknown_experiment(tmp_path):
    p = subprocess.run([BIN, "bench", "nonsense", "--out", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "invalid choice" in p.stderr


@pytest.mark.deadline(300)
def test_an_experiment_run_alone_writes_a_report_without_empty_sections(tmp_path):
    """`bench latency` alone wrote no report.md; every cell shows its spread and N; a point's p50 and p99 come from
    the same samples (the ucx_perftest reference reports one percentile per run: its p99 from a second run once fell
    below its p50, so it has none)."""
    out = tmp_path / "lat"
    p = subprocess.run([BIN, "bench", "latency", "--tiny", "--runs", "2", "--out", str(out)], capture_output=True,
                       text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = (out / "report.md").read_text()
    sections = re.split(r"^(#{2,} .*)$", report, flags=re.M)
    for head, body in zip(sections[1::2], sections[2::2]):
        assert "|" in body or "![" in body or re.search(r"^#{3,} ", body, re.M), f"empty section {head!r}"
    assert "## One-block transmission latency" in report and "## Throughput" not in report
    cells = [c.strip() for line in report.splitlines() if line.startswith("| ") and not line.startswith("| size |")
             and not line.startswith("| transport |") for c in line.strip("|").split("|")[1:]]
    numeric = [c for c in cells if re.match(r"^-?[\d.]+", c) and not re.fullmatch(r"[\d.]+ [KMG]?i?B", c)]
    assert numeric and all(re.search(r"\[-?[\d.]+–-?[\d.]+\] \(n=2\)$", c) for c in numeric), numeric[:5]
    doc = json.loads((out / "results.json").read_text())
    by_point = {}
    for r in doc["records"]:
        if r["experiment"] == "latency" and r["metric"] in ("latency_p50", "latency_p99"):
            by_point.setdefault((r["protocol"], r["transport"], r["size_bytes"], r["run"]), {})[r["metric"]] = r["value"]
    assert by_point
    for point, v in by_point.items():
        if point[0] == "ucx_raw_put":
            assert "latency_p99" not in v, "ucx_perftest's p99 would come from another run"
        elif "latency_p99" in v:
            assert v["latency_p99"] >= v["latency_p50"], (point, v)


@pytest.mark.deadline(200)
def test_pin_puts_each_side_on_its_own_cpus(tmp_path):
    """--pin: the receiving side of a peer pair (and ucx_perftest's server) on the upper half of the CPUs the bench
    may use, the sending side on the lower half; the report's settings say where. One CPU: a usage error."""
    sys.path.insert(0, str(REPO / "bench"))
    import harness
    cpus = sorted(os.sched_getaffinity(0))
    one = subprocess.run([BIN, "bench", "latency", "--tiny", "--pin", "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.sched_setaffinity(0, cpus[:1]))
    assert one.returncode == 2 and "--pin needs at least 2 CPUs" in one.stderr, one.stderr
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to pin apart")  # the usage error above is what such a host gets
    layout = harness.pin_halves(cpus)
    assert layout["receiver"] and layout["sender"] and sorted(layout["sender"] + layout["receiver"]) == cpus
    assert max(layout["sender"]) < min(layout["receiver"])
    # A child started for each side runs where the side belongs (what run_peers and perftest pass to Popen).
    harness.PIN.update(layout)
    try:
        for side in ("receiver", "sender"):
            p = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, timeout=30, preexec_fn=harness.pinned(side))
            assert json.loads(p.stdout) == layout[side], (side, p.stdout)
    finally:
        harness.PIN.update(receiver=None, sender=None)
    assert harness.pinned("sender") is None  # unpinned by default
    out = tmp_path / "pinned"
    p = subprocess.run([BIN, "bench", "latency", "--tiny", "--pin", "--transport", "shm", "--protocols", "status_byte",
                        "--out", str(out)], capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["settings"]["pin"] == layout
    assert any(r["protocol"] == "status_byte" and r["metric"] == "latency_p50" for r in doc["records"])
    assert "pin = {'receiver'" in (out / "report.md").read_text()
