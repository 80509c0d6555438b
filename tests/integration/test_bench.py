"""`slotstream bench`: a tiny run of every experiment produces well-formed records and plots.
Benchmarks measure; nothing here asserts a speed."""
import json
import subprocess

from conftest import BIN

KEYS = {"experiment": str, "protocol": str, "transport": str, "size_bytes": int, "blocks": int, "metric": str,
        "value": float, "unit": str, "repeat": int}
EXPERIMENTS = ["sync_latency", "latency", "throughput", "cpu", "resources", "held_block", "cameras"]


def test_tiny_run_of_every_experiment(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run([BIN, "bench", "all", "--tiny", "--transport", "shm", "--out", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "[throughput " in p.stdout, "no progress output"
    doc = json.loads((out / "results.json").read_text())
    for key in ("host", "ucx", "slotstream", "command", "date"):
        assert doc["config"].get(key), key
    assert doc["errors"] == []
    for rec in doc["records"]:
        assert set(rec) == set(KEYS), rec
        for k, t in KEYS.items():
            assert isinstance(rec[k], t), (k, rec)
    seen = {(r["experiment"], r["protocol"]) for r in doc["records"]}
    for exp in EXPERIMENTS:
        for proto in ("status_byte", "sliding_window"):
            assert (exp, proto) in seen, f"{exp} has no record for {proto}"
    assert ("throughput", "ucx_raw_put") in seen, "the UCX ceiling is missing"
    assert ("throughput", "tcp_socket") not in seen, "plain TCP is a reference for the tcp transport only"
    assert any(r["metric"] == "throughput" and r["unit"] == "MB/s" for r in doc["records"])
    assert all(r["value"] == 0 for r in doc["records"] if r["metric"] in ("frames_lost", "messages_lost"))
    for png in ("fig10_sync_latency.png", "fig12_latency.png", "fig13_throughput_3_blocks.png",
                "fig18_held_block.png", "fig19_cameras.png", "fig16_resources.png"):
        assert (out / png).stat().st_size > 1000, png
    report = (out / "report.md").read_text()
    assert "## Targets" in report and "fig19_cameras.png" in report


def test_bench_help_lists_experiments():
    p = subprocess.run([BIN, "bench", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    for exp in EXPERIMENTS:
        assert exp in p.stdout


def test_bench_rejects_unknown_experiment(tmp_path):
    p = subprocess.run([BIN, "bench", "nonsense", "--out", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "invalid choice" in p.stderr
