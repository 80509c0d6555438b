#!/usr/bin/env python3
"""slotstream bench: the status-byte paper's evaluation (section 4), side by side with the
sliding-window baseline, the raw UCX put ceiling and plain TCP sockets, on every transport.

Every measurement starts two real processes (`slotstream bench-peer recv` and `... send`,
docs/bench-peer.md) and records what they report. Results are tidy records in
OUT/results.json; plots are drawn from that file alone (bench/plot.py).
"""
import argparse
import os
import pathlib
import subprocess
import sys
import time

# bench/ is the script's directory, first on sys.path. Each experiment module exports EXPERIMENTS
# (name -> harness.Experiment); this script only composes them. No module imports this one.
import cache_experiments
import dgram_experiments
import fan_in_experiments
import paper_experiments
import rate_experiments
import ring_experiments
import shim_experiments
import sip_experiments
import zero_copy
from harness import DEFAULT_BLOCKS, HERE, PAPER_BLOCKS, PIN, RDMA, TRANSPORTS, Results, by_mode, host_transports, log, \
    pin_halves, registry

FULL_SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 8 << 20]
QUICK_SIZES = [64, 256, 4096, 65536, 1 << 20]


def compose(*tables):
    """The experiments of every module, in the order given (that of --help and of `all`)."""
    out = {}
    for table in tables:
        for name, experiment in table.items():
            if name in out:
                raise SystemExit(f"slotstream bench: two experiments are called {name!r}")
            out[name] = experiment
    return out


EXPERIMENTS = compose(paper_experiments.EXPERIMENTS,  # the status-byte paper's, and issue 11's idle
                      cache_experiments.EXPERIMENTS, fan_in_experiments.EXPERIMENTS, rate_experiments.EXPERIMENTS,
                      ring_experiments.EXPERIMENTS,  # the SDP paper's
                      dgram_experiments.EXPERIMENTS,  # the datagram transport's
                      shim_experiments.EXPERIMENTS,  # the socket shim's (issue 25)
                      sip_experiments.EXPERIMENTS,  # SIPp with 10,000 clients (issue 25)
                      zero_copy.EXPERIMENTS)  # issue 22's zero-copy receive against the copy path


def check_cpu(res, cpus):
    """No process can use more than all the machine's cores: a figure above that is a measuring bug."""
    for rec in res.records:
        if rec["unit"] == "% of one core" and rec["value"] > 100 * cpus * 1.02:
            res.error(f"{rec['experiment']} {rec['protocol']} {rec['transport']} {rec['metric']} (run {rec['run']})",
                      f"{rec['value']:.0f}% of one core on a {cpus}-CPU host: impossible, a measuring window is wrong")


def parse_args(argv):
    epilog = "experiments:\n" + "\n".join(f"  {n:15} {e.figures:14} {e.what}" for n, e in EXPERIMENTS.items())
    epilog += "\n  all             everything above, on every transport, plus OUT/report.md"
    ap = argparse.ArgumentParser(prog="slotstream bench", description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    ap.add_argument("--protocols", help="comma-separated (default: every protocol of `slotstream protocols`)")
    ap.add_argument("--transport", choices=TRANSPORTS, help="one transport (default: every one this host has, "
                                                            "`slotstream transports`)")
    ap.add_argument("--rdma-transport", choices=["rc", "dc", "ud"], help="rdma over UCX's rc (default), dc or ud")
    ap.add_argument("--rdma-device", help="NAME:PORT of the RDMA device (e.g. mlx5_0:1; default: any)")
    ap.add_argument("--sizes", help="comma-separated message sizes in bytes")
    ap.add_argument("--blocks", type=int, help="block count for throughput (default: 3 and 32)")
    ap.add_argument("--repeats", type=int, help="rounds of consecutive transfers per run (default 10; quick 3)")
    ap.add_argument("--runs", type=int, help="independent runs, each with fresh processes (default 3; quick 1); "
                                             "the report gives min / median / max over them")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, rounds, seconds and one run")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: seconds, not minutes
    ap.add_argument("--out", required=True, help="directory for results.json, plots and report.md")
    ap.add_argument("--force", action="store_true",
                    help=f"measure even when the load average is above {MAX_LOAD} (other work distorts the figures; "
                         "the report says the run was forced)")
    ap.add_argument("--pin", action="store_true",
                    help="run the receiving side of every peer pair (and ucx_perftest's server) on the upper half of "
                         "the CPUs this process may use and the sending side (ucx_perftest's client) on the lower "
                         "half: on 2 CPUs one each. Steadier figures on a small machine, where which threads share a "
                         "core decides small-message rates (docs/benchmarks.md, issue 32 item 4). Experiments that start "
                         "processes other than a peer pair (fan_in, cameras, the datagram loss, shim and SIPp runs) "
                         "stay unpinned; zero_copy pins its own. Default: unpinned, wherever the scheduler puts them")
    a = ap.parse_args(argv)
    if a.runs is not None and a.runs < 1:
        ap.error("--runs must be at least 1")
    if a.pin:
        try:
            a.pin = pin_halves(os.sched_getaffinity(0))
        except ValueError as e:
            ap.error(str(e))
    return a


# Above this 1-minute load average at start, other work would share the cores with the measured
# processes: the run refuses (unless --force). The load is recorded in the report either way.
MAX_LOAD = 1.5


def load_gate(a, load):
    """None when measuring may start at 1-minute load average `load`, else why not (one line)."""
    if load <= MAX_LOAD or a.force or a.tiny:  # --tiny: the tests' mode, figures mean nothing
        return None
    return (f"the load average is {load:.2f} (above {MAX_LOAD}): other work would share the cores with the "
            "measured processes and distort every figure; wait until the machine is quiet (`uptime`) or pass "
            "--force (the report then says the run was forced)")


def settings(a):
    """What every experiment reads (cfg): the options, the registry, the shared settings of the mode
    (full, --quick, --tiny) and each experiment's own defaults for that mode."""
    cfg = argparse.Namespace()
    RDMA.update(transport=a.rdma_transport, device=a.rdma_device)
    PIN.update(a.pin or {"receiver": None, "sender": None})
    cfg.pin = a.pin or None  # the report's settings line says where the sides ran
    cfg.registry = registry()
    data_protocols = [n for n, p in cfg.registry.items() if not p["reference"]]
    cfg.protocols = [p for p in a.protocols.split(",") if p] if a.protocols else data_protocols
    for p in cfg.protocols:  # an unknown one fails in its peer and is reported as an error record
        cfg.registry.setdefault(p, {"connection_per_device": False, "reference": False})
    cfg.transports = [a.transport] if a.transport else host_transports()
    quick = a.quick or a.tiny
    cfg.mode = "tiny" if a.tiny else "quick" if a.quick else "full"
    cfg.runs = a.runs or (1 if quick else 3)
    cfg.quick, cfg.tiny = a.quick, a.tiny
    cfg.sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else (QUICK_SIZES if quick else FULL_SIZES)
    cfg.sizes_given = bool(a.sizes)
    cfg.block_sets = [a.blocks] if a.blocks else [PAPER_BLOCKS, DEFAULT_BLOCKS]
    cfg.repeats = a.repeats or (2 if a.tiny else 3 if quick else 10)
    cfg.round_bytes = (1 << 20) if a.tiny else (8 << 20) if quick else (32 << 20)
    for experiment in EXPERIMENTS.values():
        for k, v in by_mode(experiment.defaults, cfg.mode).items():
            setattr(cfg, k, v)
    if a.tiny:
        # One size (the 256 B target point): the test checks records and plots, not curves,
        # and must stay well under a minute on every transport of a 2-core machine.
        cfg.sizes = [256] if not a.sizes else cfg.sizes
        cfg.block_sets = cfg.block_sets[:1]
    return cfg


def measure(res, cfg, names):
    """Every run of the named experiments. Runs outermost: each run measures every experiment once, so
    that a slow phase of the machine spreads over all protocols instead of landing on one."""
    for run in range(cfg.runs):
        res.run = run
        done = set()
        for name in names:
            experiment = EXPERIMENTS[name]
            if experiment.run in done:
                continue  # throughput and cpu come from the same runs
            done.add(experiment.run)
            log(f"== {name}{f' (run {run + 1} of {cfg.runs})' if cfg.runs > 1 else ''}: {experiment.what}")
            experiment.run(res, cfg)
            res.save()


def main(argv):
    a = parse_args(argv)
    out = pathlib.Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a usage error, as the CLI's own: one line, exit 2, nothing measured in vain
        print(f"slotstream bench: error: cannot create --out {out}: {e.strerror}; give a writable directory",
              file=sys.stderr)
        return 2
    # After the usage errors (a machine's load is no reason to hide a mistake in the command).
    load_start = os.getloadavg()[0]  # the figure gated on is the one recorded
    if why := load_gate(a, load_start):
        print(f"slotstream bench: error: {why}", file=sys.stderr)
        return 2
    cfg = settings(a)
    res = Results(out, argv)
    res.config["settings"] = {k: v for k, v in vars(cfg).items() if k != "registry"}
    res.config["settings"]["rdma"] = dict(RDMA)
    res.config["load"] = {"start": round(load_start, 2), "limit": MAX_LOAD, "forced": a.force}
    t0 = time.monotonic()
    measure(res, cfg, list(EXPERIMENTS) if a.experiment == "all" else [a.experiment])
    res.config["load"]["end"] = round(os.getloadavg()[0], 2)
    check_cpu(res, os.cpu_count() or 1)
    res.save()
    log(f"== measured in {time.monotonic() - t0:.0f} s; results in {out / 'results.json'}")
    # Every run writes its report, whatever it measured (plot.py leaves out the sections without data).
    plot = subprocess.run([sys.executable, str(HERE / "plot.py"), str(out / "results.json"), "--report"])
    if plot.returncode != 0:
        log("plotting failed (is python3-matplotlib installed? scripts/setup.sh installs it)")
        return 1
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
