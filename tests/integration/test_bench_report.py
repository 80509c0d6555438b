"""The bench report's own arithmetic (issue 32 item 3), on made-up records: no run, no binary."""
import functools
import subprocess
import sys
import types

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import harness  # noqa: E402
import paper_experiments  # noqa: E402
import plot  # noqa: E402
import zero_copy  # noqa: E402

STAGES = ("fill", "post", "fabric_poll", "deliver")


def traced(messages):
    """A sender's and a receiver's --trace output for `messages`: one dict of event -> ns each (packet i)."""
    snd = {"trace": [], "send_times_ns": [m["stamp"] for m in messages]}
    rcv = {"trace": []}
    for i, m in enumerate(messages):
        snd["trace"] += [[k, 0, i, m[k]] for k in ("committed", "posted")]
        rcv["trace"] += [[k, 0, i, m[k]] for k in ("polled", "delivered")]
    return snd, rcv


def test_a_late_stamp_makes_no_stage_negative_and_the_stages_add_up_to_the_total():
    # Message 0 in order. Message 1: the receiver polled it before its transmitter stamped `posted` (a packed record
    # the sending thread sent, or a shm put the receiver found before the call returned) — the report said
    # `tcp status_byte 256 B ... -2.93`. Message 2: its filler stamped `committed` after the record was posted.
    messages = [{"stamp": 0, "committed": 1000, "posted": 2000, "polled": 5000, "delivered": 6000},
                {"stamp": 0, "committed": 1000, "posted": 9000, "polled": 4000, "delivered": 5000},
                {"stamp": 0, "committed": 8000, "posted": 3000, "polled": 6000, "delivered": 7000}]
    for m in messages:
        stages = paper_experiments.message_stages(m)
        assert all(stages[s] >= 0 for s in STAGES), (m, stages)
        assert abs(sum(stages[s] for s in STAGES) - (m["delivered"] - m["stamp"]) / 1000) < 1e-9, (m, stages)
    out = paper_experiments.latency_stages(*traced(messages))
    assert all(out[s] >= 0 for s in STAGES), out
    assert abs(sum(out[s] for s in STAGES) - out["total"]) < 1e-9
    assert abs(out["total"] - 6.0) < 1e-9, "the mean of 6, 5 and 7 µs stamp-to-delivered"


def test_a_message_missing_an_event_is_left_out_of_every_stage():
    messages = [{"stamp": 0, "committed": 1000, "posted": 2000, "polled": 3000, "delivered": 4000},
                {"stamp": 0, "committed": 1000, "posted": 2000, "polled": 30000, "delivered": 40000}]
    snd, rcv = traced(messages)
    rcv["trace"] = [e for e in rcv["trace"] if not (e[0] == "delivered" and e[2] == 1)]
    out = paper_experiments.latency_stages(snd, rcv)
    assert out["fabric_poll"] == 1.0 and out["total"] == 4.0, out


def test_the_report_stage_cells_add_up_to_the_total_cell():
    records = []
    for run, (fill, post, poll, deliver) in enumerate([(1.0, 0.5, 2.0, 0.25), (3.0, 0.5, 1.0, 0.25),
                                                        (2.0, 2.5, 0.0, 0.25)]):
        for name, v in zip(STAGES + ("total",), (fill, post, poll, deliver, fill + post + poll + deliver)):
            records.append({"experiment": "latency", "protocol": "status_byte", "transport": "tcp", "size_bytes": 256,
                            "metric": f"stage_{name}_mean", "value": v, "run": run})
    row = [line for line in plot.stage_table(records).splitlines() if "status_byte" in line][0]
    cells = [c.strip() for c in row.strip("|").split("|")][3:]
    values = [float(c.split()[0]) for c in cells]
    assert abs(sum(values[:4]) - values[4]) < 0.011, row
    assert all("[" in c and "(n=3)" in c for c in cells), row


class Cfg:
    camera_seconds = 2


def test_the_cameras_jitter_shows_frames_that_land_late_within_their_bin():
    # 12 cameras at 25 fps for 2 s, each frame sent on its period. Steady: every frame takes 1 ms. Jittery: every
    # other frame takes 30 ms, still inside its 200 ms bin — the bins' CoV is 0 for both (Fig. 19's measure, which
    # could not tell them apart); the frame jitter is not.
    sends = [i * 40_000_000 for i in range(50) for _ in range(12)]

    def peers(delays_ms):
        latencies = [int(delays_ms[k % len(delays_ms)] * 1e6) for k in range(len(sends))]
        return {"send_times_ns": sends}, {"arrivals_ns": [s + d for s, d in zip(sends, latencies)],
                                          "latencies_ns": latencies}

    steady, jittery = peers([1.0]), peers([1.0, 1.0] * 6 + [30.0, 30.0] * 6)
    for snd, rcv in (steady, jittery):
        _, _, cov, _ = paper_experiments.camera_stream(Cfg, snd, rcv)
        assert cov < 1e-9, cov
    assert paper_experiments.frame_jitter_ms(steady[1]) < 1e-9
    assert abs(paper_experiments.frame_jitter_ms(jittery[1]) - 14.5) < 1e-6


def test_the_cameras_target_judges_the_jitter():
    records = [{"experiment": "cameras", "protocol": p, "transport": "shm", "variant": "per_connection", "run": 0,
                "metric": m, "value": v, "size_bytes": 921600, "blocks": 32}
               for p, jitter in (("status_byte", 0.25), ("sliding_window", 4.0))
               for m, v in (("frame_jitter", jitter), ("throughput_cov", 0.0), ("frames_lost", 0))]
    tg = plot.Targets()
    plot._camera_targets(tg, records, "shm", "status_byte", "sliding_window")
    text = tg.text()
    assert "jitter" in text and "0.250" in text and "4.000" in text, text


def test_no_legend_covers_a_panel(tmp_path, monkeypatch):
    # Legends were drawn inside their panels ("best"), over lines and points of the busier figures. Every legend of
    # the report's line figures and its over-time figures (Fig. 18-19) now lies outside every panel of its figure.
    import plot_common

    figures = []
    real_close = plot_common.plt.close
    monkeypatch.setattr(plot_common.plt, "close", lambda fig=None: figures.append(fig) if fig != "all" else None)
    protocols = ["status_byte", "sliding_window", "credit", "carc", "packed_ring", "nic_assisted", "buffered_read",
                 "ucx_raw_put", "tcp_socket"]
    sizes = [64, 256, 4096, 65536, 1048576]
    data = {(p, t): [(s, 100.0 + 10 * i + s / 1e4) for s in sizes] for i, p in enumerate(protocols)
            for t in ("shm", "tcp")}
    assert plot_common.line_plot(tmp_path / "a.png", "lines", data, "size", "MB/s")
    samples = {f"{p}/{t}": {"bin_ms": 200, "mb_per_s": [276.0] * 20, "stop_ms": 3000}
               for p in protocols[:2] for t in ("shm", "tcp")}
    assert plot.over_time(tmp_path / "b.png", "cameras", samples)
    assert len(figures) == 2
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        panels = [ax.get_window_extent(renderer) for ax in fig.axes]
        legends = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
        assert len(legends) == len(panels)
        for lg in legends:
            assert not any(lg.overlaps(p) for p in panels), (lg, panels)
        real_close(fig)


def test_a_benchmark_refuses_a_loaded_machine_unless_forced_and_the_report_says_which(monkeypatch, tmp_path, capsys):
    import slotstream_bench
    monkeypatch.setattr(slotstream_bench.os, "getloadavg", lambda: (3.2, 2.0, 1.0))
    out = tmp_path / "never"
    assert slotstream_bench.main(["latency", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "load average is 3.20" in err and "--force" in err, err
    assert not (out / "results.json").exists(), "nothing is measured on a refused run"
    # A mistake in the command is said first, whatever the load.
    (tmp_path / "file").write_text("")
    assert slotstream_bench.main(["latency", "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot create --out" in capsys.readouterr().err
    assert slotstream_bench.load_gate(slotstream_bench.parse_args(["latency", "--force", "--out", "x"]), 3.2) is None
    assert slotstream_bench.load_gate(slotstream_bench.parse_args(["latency", "--tiny", "--out", "x"]), 3.2) is None
    assert slotstream_bench.load_gate(slotstream_bench.parse_args(["latency", "--out", "x"]), 0.4) is None
    # The report's header line for each case.
    assert "Forced" in plot.load_line({"start": 3.2, "limit": 1.5, "forced": True, "end": 3.0})
    assert "refuses to start above 1.5" in plot.load_line({"start": 0.4, "limit": 1.5, "forced": False, "end": 1.8})
    assert "--tiny" in plot.load_line({"start": 3.2, "limit": 1.5, "forced": False})
    assert "not recorded" in plot.load_line(None)


def fake_results():
    """What zero_copy.record writes to: harness.Results' own add() and run, without its start-up (a binary, UCX)."""
    res = types.SimpleNamespace(records=[], run=0)
    res.add = functools.partial(harness.Results.add, res)
    return res


def test_zero_copy_tables_span_every_run_not_one_table_per_run(tmp_path):
    # zero_copy.md used to get one "1 runs" table per run, every cell [x–x]: now median [min–max] over the runs.
    res = fake_results()
    for run, fps in enumerate((1000.0, 3000.0, 2000.0)):
        res.run = run
        point = {"fps": fps, "cpu_us": 10.0, "rss_mb": 50.0, "tx_fps": fps, "tx_mb_s": 0.0}
        zero_copy.record(res, "shm", {("saturation", "free", "640x480x3", "copy"): [point],
                                      ("saturation", "free", "640x480x3", "view"): [dict(point, fps=2 * fps)],
                                      ("held", 0, "640x480x3"): [point], ("held", 16, "640x480x3"): [point]})
    zero_copy.write_tables(tmp_path / "zero_copy.md", res.records)
    md = (tmp_path / "zero_copy.md").read_text()
    assert "shm, 3 runs, median [min–max]" in md and "tcp" not in md, md
    assert "| 640x480x3 | synthetic, shared CPUs | 2000 [1000–3000] | 4000 [2000–6000] | 2.00x [2.00–2.00] |" in md, md
    # The held table's MB/s comes from the frame's bytes: 2000 frames/s of 921,600 bytes.
    assert "| 16 | 640x480x3 | 2000 [1000–3000] | 1843 [922–2765] | 1.00x [1.00–1.00] |" in md, md


def test_the_report_names_the_commit_of_the_measured_binary(tmp_path):
    # A binary in a git checkout: its commit, and whether src/ had uncommitted changes when the run started.
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "build").mkdir()
    (repo / "src" / "a.cc").write_text("int a;\n")
    (repo / "build" / "slotstream").write_text("")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src/a.cc"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    commit = subprocess.run([*git, "log", "-1", "--format=%h", "--abbrev=12"], capture_output=True, text=True,
                            check=True).stdout.strip()
    src = harness.binary_source(repo / "build" / "slotstream")
    assert src["commit"] == commit and src["changed"] is False, src
    assert f"at commit {commit} when the run started" in plot.source_line(src)
    (repo / "src" / "a.cc").write_text("int b;\n")
    src = harness.binary_source(repo / "build" / "slotstream")
    assert src["changed"] is True and "with uncommitted changes" in plot.source_line(src)
    # Outside a checkout (installed), and a record from before this field.
    outside = tmp_path / "bin" / "slotstream"
    outside.parent.mkdir()
    outside.write_text("")
    assert harness.binary_source(outside)["commit"] is None
    assert "outside a git checkout" in plot.source_line(harness.binary_source(outside))
    assert "not recorded" in plot.source_line(None)


def test_a_record_names_its_processor_and_the_report_says_it():
    """The same command gives other figures on another processor (the references too): a record says which."""
    model = harness.cpu_model()
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == "model name"]
    assert model == (names[0] if names and names[0] else None)
    config = {"command": "slotstream bench x", "host": "h", "cpus": 2, "kernel": "k", "slotstream": "s", "ucx": "u",
              "date": "d"}
    assert "(2 CPUs, kernel k)" in "".join(plot.report_header({"config": config}))  # a record older than the field
    config["cpu_model"] = "Some CPU 9000"
    assert "(2 CPUs, Some CPU 9000, kernel k)" in "".join(plot.report_header({"config": config}))


def rounds_cfg(repeats=3):
    return types.SimpleNamespace(repeats=repeats, registry={"ucx_raw_put": {"reference": True}})


def test_the_counted_throughput_rounds_are_the_last_ones_after_the_warm_up():
    # 10 rounds of 100 transfers of 1,000 B: the first six slow (10 µs apart, a first thread placement that
    # shares a core), then fast (1 µs apart). Every counted round is fast, however long the slow start.
    count, size = 100, 1000
    gaps = [10_000] * 600 + [1_000] * 400
    sends = [sum(gaps[:i]) for i in range(len(gaps))]
    arrivals = [t + 500 for t in sends]
    rates = paper_experiments.round_rates(rounds_cfg(), "status_byte", size, count, {"send_times_ns": sends},
                                          {"arrivals_ns": arrivals})
    assert len(rates) == 3, rates
    assert all(900 < r < 1100 for r in rates), rates  # ~1,000 MB/s; a slow round would be ~100


def test_a_time_bounded_sender_gives_fewer_rounds_and_too_few_transfers_give_an_error():
    cfg = rounds_cfg(repeats=3)
    assert paper_experiments.counted_rounds(cfg, 100, 1000) == (700, 3)
    assert paper_experiments.counted_rounds(cfg, 100, 250) == (150, 1)  # what precedes the last whole round warms up
    try:
        paper_experiments.counted_rounds(cfg, 100, 150)
    except harness.PeerError as e:
        assert "fewer than two rounds of 100" in str(e)
    else:
        raise AssertionError("150 transfers cannot make a warm-up round and a counted one")


def test_a_reference_round_ends_at_the_next_send_not_at_the_senders_finish():
    # ucx_raw_put delivers nothing, so its sends time it. Its last transfer only marks the end of the last
    # counted round; the sender's finish (end handshake, 5 ms here) is in no round.
    count = 100
    sends = list(range(0, 400 * 1000, 1000))  # 400 transfers, 1 µs apart: a warm-up round and three more
    snd = {"send_times_ns": sends, "seconds": (sends[-1] + 5_000_000) / 1e9}
    rates = paper_experiments.round_rates(rounds_cfg(), "ucx_raw_put", 1000, count, snd, {"arrivals_ns": []})
    assert rates and all(abs(r - 1000) < 1 for r in rates), rates  # with the finish in it a round made ~20 MB/s
