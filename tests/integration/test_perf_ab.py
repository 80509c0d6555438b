"""scripts/perf-ab.sh, the A/B gate: its verdict logic on made-up rounds, and its panel read from a real
tiny run (one binary as both sides). Nothing here asserts a speed."""
import importlib.util
import json
import os
import re
import subprocess

import pytest

from conftest import BIN, REPO

spec = importlib.util.spec_from_file_location("perf_ab", REPO / "scripts" / "perf_ab.py")
perf_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(perf_ab)


def test_verdict_against_the_aa_spread():
    # Higher is better: 10 % worse with BASE's rounds 2 % apart is a regression; 1 % worse is not.
    r, spread, p, word = perf_ab.verdict([100, 101, 102], [90, 90, 91], "higher")
    assert word == "REGRESSION" and r == pytest.approx(0.891, abs=1e-3) and spread == pytest.approx(0.02)
    assert p == pytest.approx(0.05)  # three rounds a side, all below: 1 in 20 arrangements
    assert perf_ab.verdict([100, 101, 102], [100, 100, 99], "higher")[3] == "ok"
    assert perf_ab.verdict([100, 101, 102], [120, 119, 121], "higher")[3] == "better"
    # The same 10 % inside a spread of 30 % between BASE's own rounds is noise.
    assert perf_ab.verdict([100, 130, 110], [99, 100, 98], "higher")[3] == "ok"
    # Lower is better (latency, CPU): up is worse.
    assert perf_ab.verdict([5.0, 5.1, 5.0], [6.0, 6.1, 6.0], "lower")[3] == "REGRESSION"
    assert perf_ab.verdict([5.0, 5.1, 5.0], [4.0, 4.1, 4.0], "lower")[3] == "better"
    # Below the floor nothing is a verdict, however tight BASE's rounds are.
    assert perf_ab.verdict([100, 100, 100], [98, 98, 98], "higher")[3] == "ok"
    # No value on a side, or a single BASE round (no spread): no verdict.
    assert perf_ab.verdict([None, None], [1, 2], "higher")[3] == "n/a"
    assert perf_ab.verdict([100], [50], "higher") == (0.5, None, None, "n/a")


# Rounds of a point that falls in one of two modes a factor 2 apart, as small-message rates and 32-block throughput
# do on the 2-core VM: BASE's A/A spread is over 100 %, so no loss can be worse than the spread.
BIMODAL = [20.3, 10.1, 19.8, 10.4, 20.9, 9.9, 20.1, 10.2, 19.5]
HALVED = [10.0, 5.1, 9.7, 5.0, 9.9, 4.9, 9.6, 5.2, 9.8]


def test_rank_test_counts_the_rounds_that_rank_worse():
    assert perf_ab.rank_p([1, 2, 3], [4, 5, 6], "higher") == pytest.approx(1 / 20)  # all below: 1 of C(6,3)
    assert perf_ab.rank_p([4, 5, 6], [1, 2, 3], "higher") == 1.0
    assert perf_ab.rank_p([4, 5, 6], [1, 2, 3], "lower") == pytest.approx(1 / 20)
    assert perf_ab.rank_p([1, 5], [2, 3, 4], "higher") == pytest.approx(6 / 10)  # 3 pairs no worse: 6 of C(5,2)
    assert perf_ab.rank_p([2, 2, 2], [2, 2, 2], "higher") == 1.0  # ties are never worse


def test_a_halved_point_is_a_regression_where_the_spread_is_wider_than_the_loss():
    r, spread, p, word = perf_ab.verdict(BIMODAL, HALVED, "higher")
    assert spread > 1 and r == pytest.approx(0.49, abs=0.01)  # the spread rule alone: ok
    assert p <= perf_ab.RANK_P and word == "REGRESSION"
    assert perf_ab.verdict(HALVED, BIMODAL, "higher")[3] == "better"
    assert perf_ab.verdict([1 / v for v in BIMODAL], [1 / v for v in HALVED], "lower")[3] == "REGRESSION"
    # Equal binaries: the same two modes, drawn in another order.
    assert perf_ab.verdict(BIMODAL, [10.3, 20.2, 9.8, 19.9, 10.0, 20.6, 10.5, 19.7, 20.0], "higher")[3] == "ok"
    # Ranked below in every round, but by less than RANK_EFFECT: no verdict from the rank rule.
    assert perf_ab.verdict(BIMODAL, [v * 0.95 for v in BIMODAL], "higher")[3] == "ok"
    # Five rounds a side never reach RANK_P (1 in 252 at best); the looser RANK_P_FLAG sends them to be confirmed.
    assert perf_ab.verdict(BIMODAL[:5], HALVED[:5], "higher")[3] == "ok"
    assert perf_ab.verdict(BIMODAL[:5], HALVED[:5], "higher", p_limit=perf_ab.RANK_P_FLAG)[3] == "REGRESSION"


def test_no_verdict_on_a_loaded_machine():
    status, line = perf_ab.overall(["shm 64 KiB x3 throughput"], 1.6, 0.0, 3)
    assert status == 3 and "NO VERDICT" in line and "1.60" in line
    status, line = perf_ab.overall([], 0.2, 0.9, 3)
    assert status == 3 and "other processes used 0.90 cores" in line
    assert perf_ab.overall(["x"], 0.2, 0.1, 3) == (1, "perf-ab: REGRESSION at 1 point(s): x")
    assert perf_ab.overall([], 0.2, 0.1, 3)[0] == 0
    assert perf_ab.overall([], 0.2, 0.1, 1)[0] == 3


def records(tput_shm_64k_x3=10_000.0):
    """One side's round of the panel as bench records, every point present."""
    def rec(exp, proto, t, size, metric, value, blocks=3, **extra):
        return dict(experiment=exp, protocol=proto, transport=t, size_bytes=size, blocks=blocks, metric=metric,
                    value=value, unit="", run=0, repeat=0, variant="", **extra)
    R = {"latency": [rec("latency", "status_byte", "shm", 64, "latency_p50", 5.0),
                     rec("latency", "ucx_raw_put", "shm", 64, "latency_p50", 0.5, blocks=1)],
         "rate": [], "tput-shm": [], "tput-tcp": []}
    for s in (64, 256):
        R["rate"] += [rec("message_rate", "status_byte", "shm", s, "message_rate", 6e6, blocks=32, devices=1),
                      rec("message_rate", "status_byte", "shm", s, "message_rate", 1e6, blocks=32, devices=12),
                      rec("message_rate", "ucx_perftest_put_bw", "shm", s, "message_rate", 12e6, blocks=1, devices=1)]
    for t in ("shm", "tcp"):
        for b in (3, 32):
            for s in (65536, 1 << 20):
                v = tput_shm_64k_x3 if (t, b, s) == ("shm", 3, 65536) else 5000.0
                # Three rounds of the run: the point is their median; the paper's variant beside it is not read.
                R[f"tput-{t}"] += [rec("throughput", "status_byte", t, s, "throughput", x, blocks=b)
                                   for x in (v, v * 1.01, v * 0.99)]
                R[f"tput-{t}"].append(rec("throughput", "status_byte:policy=paper", t, s, "throughput", 1.0, blocks=b))
                R[f"tput-{t}"] += [rec("throughput", "ucx_raw_put", t, s, "throughput", 10_000.0, blocks=b),
                                   rec("throughput", "tcp_socket", t, s, "throughput", 4000.0, blocks=b),
                                   rec("cpu", "status_byte", t, s, "cpu_receiver_per_mb", 0.1, blocks=b),
                                   rec("cpu", "status_byte", t, s, "cpu_sender_per_mb", 0.2, blocks=b)]
    return R


def test_every_point_is_read_and_a_halved_point_is_the_regression():
    rounds = {"BASE": [records(10_000.0), records(10_100.0), records(9_900.0)],
              "HEAD": [records(5_000.0), records(5_050.0), records(4_950.0)]}
    lines, regressions, rows = perf_ab.table(perf_ab.points(), rounds)
    assert len(rows) == len(perf_ab.points()) == len(lines) - 1
    assert all(r["verdict"] in ("ok", "REGRESSION") for r in rows), [r for r in rows if r["verdict"] == "n/a"]
    assert regressions == ["shm 64 KiB x3 throughput", "shm 64 KiB x3 throughput / ucx_raw_put"]
    row = {r["point"]: r for r in rows}
    assert row["shm 64 KiB x3 throughput"]["ratio"] == pytest.approx(0.5)
    assert row["shm 64 B latency p50 / ucx_perftest put_lat"]["head"] == [10.0] * 3
    assert row["shm 256 B rate, 1 device"]["base"] == [6.0] * 3  # 1 device, in M msg/s
    assert row["tcp 1 MiB x32 throughput / tcp_socket"]["base"] == [1.25] * 3
    assert row["tcp 1 MiB x32 sender CPU"]["base"] == [0.2] * 3
    assert "REGRESSION" in lines[[r["point"] for r in rows].index("shm 64 KiB x3 throughput") + 1]


@pytest.mark.deadline(280)  # 2 rounds x 2 sides x 4 tiny bench runs (+1 round of a flagged one): ~40 s quiet
def test_tiny_run_reads_the_real_panel(tmp_path):
    env = dict(os.environ, SLOTSTREAM_BIN=BIN, PERF_AB_OUT=str(tmp_path))
    p = subprocess.run(["bash", str(REPO / "scripts" / "perf-ab.sh"), "--tiny", "--no-wait"], capture_output=True,
                       text=True, timeout=270, env=env)
    assert p.returncode in (0, 1, 3), p.stdout[-3000:] + p.stderr[-3000:]
    assert "round 2/2 BASE tput-tcp" in p.stdout, "no progress lines"
    doc = json.loads((tmp_path / "perf-ab.json").read_text())
    assert doc["errors"] == [], doc["errors"]
    row = {r["point"]: r for r in doc["points"]}
    # What --tiny measures (3 blocks, 256 B rate) is read on both sides in both rounds.
    for point in ("shm 64 B latency p50", "shm 64 B latency p50 / ucx_perftest put_lat", "shm 256 B rate, 1 device",
                  "shm 64 KiB x3 throughput", "shm 1 MiB x3 throughput / ucx_raw_put",
                  "tcp 64 KiB x3 throughput / tcp_socket", "tcp 1 MiB x3 receiver CPU", "shm 64 KiB x3 sender CPU"):
        assert None not in row[point]["base"] + row[point]["head"], (point, row[point])
        n = 2 + (doc["confirm_rounds"] if row[point]["run"] in doc["confirmed_runs"] else 0)  # --tiny: 1 to confirm
        assert len(row[point]["base"]) == n and row[point]["verdict"] in ("ok", "better", "REGRESSION"), row[point]
    # The verdict line: a verdict, or a refusal that says why.
    last = p.stdout.strip().splitlines()[-1]
    assert re.match(r"perf-ab: (no regression|REGRESSION at \d+ point|NO VERDICT: .*load|NO VERDICT: other)", last), last
    assert {0: "no regression", 1: "REGRESSION", 3: "NO VERDICT"}[p.returncode] in last


pinned = []


def fake_panel(monkeypatch, tmp_path, head_tput, base_tput=lambda r: 10_000.0 + 100 * (r % 2)):
    """perf_ab.main in --tiny form with its bench runs replaced by made-up records: the shm 64 KiB x3 throughput
    in round r is head_tput(r) for HEAD and base_tput(r) for BASE, every other point equal on both sides.
    Returns the bench runs made, as (round, side, run name); `pinned` (module-level) whether each had --pin."""
    runs = []
    pinned.clear()

    def bench(harness, binary, args, out, log_file):
        r, side, name = out.name.split("-", 2)
        runs.append((int(r[1:]), side, name))
        pinned.append("--pin" in args)
        R = records(head_tput(int(r[1:])) if side == "head" else base_tput(int(r[1:])))
        return R[name], []

    monkeypatch.setattr(perf_ab, "bench", bench)
    # A quiet machine as far as the verdict goes: the made-up rounds are what is judged.
    monkeypatch.setattr(perf_ab, "load1", lambda: 0.1)
    monkeypatch.setattr(perf_ab, "busy_seconds", lambda: 0.0)
    monkeypatch.setattr(perf_ab, "own_seconds", lambda: 0.0)
    monkeypatch.setenv("SLOTSTREAM_BIN", BIN)
    monkeypatch.setenv("PERF_AB_OUT", str(tmp_path))
    return runs


def test_a_point_worse_in_one_slow_spell_is_confirmed_away(monkeypatch, tmp_path, capsys):
    # HEAD halved in the two panel rounds only (a slow spell), equal in the confirming ones.
    runs = fake_panel(monkeypatch, tmp_path, lambda r: 5_000.0 if r <= 2 else 10_000.0)
    status = perf_ab.main(["--tiny", "--no-wait", "--confirm", "3"])
    out = capsys.readouterr().out
    assert "3 more round(s) of tput-shm before a verdict" in out, out
    # Only the run behind the flagged point was repeated, on both sides.
    assert sorted({(r, n) for r, _, n in runs if r > 2}) == [(3, "tput-shm"), (4, "tput-shm"), (5, "tput-shm")]
    doc = json.loads((tmp_path / "perf-ab.json").read_text())
    row = {r["point"]: r for r in doc["points"]}["shm 64 KiB x3 throughput"]
    assert len(row["head"]) == 5 and row["verdict"] == "ok", row
    # A point of a run that was not repeated keeps its two rounds.
    assert len({r["point"]: r for r in doc["points"]}["tcp 1 MiB x3 throughput"]["base"]) == 2
    assert doc["confirm_rounds"] == 3 and doc["confirmed_runs"] == ["tput-shm"]
    assert status == 0 and out.strip().splitlines()[-1] == perf_ab.NO_REGRESSION


def test_a_point_worse_in_every_round_stays_a_regression(monkeypatch, tmp_path, capsys):
    runs = fake_panel(monkeypatch, tmp_path, lambda r: 5_000.0)
    status = perf_ab.main(["--tiny", "--no-wait"])  # --tiny confirms with 1 round
    out = capsys.readouterr().out
    assert {n for r, _, n in runs if r > 2} == {"tput-shm"} and max(r for r, _, _ in runs) == 3
    assert status == 1 and "REGRESSION at 2 point(s): shm 64 KiB x3 throughput;" in out.strip().splitlines()[-1]


def test_confirming_can_be_turned_off(monkeypatch, tmp_path, capsys):
    runs = fake_panel(monkeypatch, tmp_path, lambda r: 5_000.0)
    assert perf_ab.main(["--tiny", "--no-wait", "--confirm", "0"]) == 1
    assert max(r for r, _, _ in runs) == 2


def test_a_halved_binary_on_a_bimodal_point_is_confirmed_as_a_regression(monkeypatch, tmp_path, capsys):
    # The loss issue 32 found (half the throughput at 64 KiB) on a point whose rounds fall in two modes: the five
    # panel rounds flag it by rank, the four confirming ones make it a REGRESSION.
    runs = fake_panel(monkeypatch, tmp_path, lambda r: 1000 * HALVED[r - 1], lambda r: 1000 * BIMODAL[r - 1])
    status = perf_ab.main(["--tiny", "--no-wait", "--rounds", "5", "--confirm", "4"])
    out = capsys.readouterr().out
    assert "4 more round(s) of tput-shm before a verdict" in out, out
    row = {r["point"]: r for r in json.loads((tmp_path / "perf-ab.json").read_text())["points"]}
    row = row["shm 64 KiB x3 throughput"]
    assert len(row["head"]) == 9 and row["spread"] > 1 and row["p_worse"] <= perf_ab.RANK_P, row
    assert status == 1 and "REGRESSION at 2 point(s): shm 64 KiB x3 throughput;" in out.strip().splitlines()[-1]
    assert max(r for r, _, _ in runs) == 9


def test_the_looser_rank_test_only_picks_what_to_confirm(monkeypatch, tmp_path, capsys):
    # HEAD twice as fast in each of five bimodal rounds: all but 3 of 25 pairs better (p = 7/252), a spread of
    # over 100 %. Not worse, so nothing is confirmed — and the verdict is taken at RANK_P, not RANK_P_FLAG: ok.
    fake_panel(monkeypatch, tmp_path, lambda r: 2000 * BIMODAL[r - 1], lambda r: 1000 * BIMODAL[r - 1])
    assert perf_ab.main(["--tiny", "--no-wait", "--rounds", "5", "--confirm", "4"]) == 0
    row = {r["point"]: r for r in json.loads((tmp_path / "perf-ab.json").read_text())["points"]}
    assert row["shm 64 KiB x3 throughput"]["verdict"] == "ok" and len(row["shm 64 KiB x3 throughput"]["base"]) == 5
    assert "more round(s)" not in capsys.readouterr().out


def test_pin_is_passed_to_every_bench_run(monkeypatch, tmp_path, capsys):
    fake_panel(monkeypatch, tmp_path, lambda r: 10_000.0)
    assert perf_ab.main(["--tiny", "--no-wait", "--pin"]) == 0
    assert pinned and all(pinned), pinned
    assert "pinned (--pin)" in capsys.readouterr().out
    assert json.loads((tmp_path / "perf-ab.json").read_text())["pin"] is True
    fake_panel(monkeypatch, tmp_path, lambda r: 10_000.0)
    assert perf_ab.main(["--tiny", "--no-wait"]) == 0
    assert pinned and not any(pinned)
