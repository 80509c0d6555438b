#!/usr/bin/env python3
"""perf-ab: A/B of two slotstream builds on a fixed panel of `slotstream bench` points.

    scripts/perf-ab.sh BASE [HEAD]      # BASE, HEAD: commits (HEAD: the working tree when left out)

BASE (and HEAD, when it is a commit) is checked out in a git worktree under build-ab/ and only its CLI
(the slotstream_cli target) is built there, RelWithDebInfo like scripts/build.sh, through ccache when
there is one; the working tree's HEAD is built in build/. Both binaries are then measured by the same
harness (HEAD's bench/, SLOTSTREAM_BIN pointing at each binary in turn), the panel's bench runs
alternating BASE and HEAD run by run, for --rounds rounds (default 5; the side that goes first swaps
every round). Per point it prints the median over the rounds of each side, HEAD/BASE, the A/A spread
(max/min - 1 over BASE's rounds: how far two runs of the same binary fall apart here), p (the rank test below)
and a verdict: REGRESSION where HEAD is worse than BASE by more than the spread (and at least SPREAD_FLOOR), or where
HEAD's rounds rank below BASE's (an exact one-sided Mann-Whitney test over the rounds, p <= RANK_P) with medians at
least RANK_EFFECT apart; better where it is better by either rule, else ok. The rank rule is for the points whose
rounds are bimodal on this machine (small-message rates, 32 blocks): there max/min is 100-600 %, and a loss of half
stayed inside it, while the rounds of a halved binary still rank below the other's. A point found worse is not yet a
REGRESSION: the bench runs it comes from are run --confirm more rounds (default 4, alternated the same way) and the
verdict is taken again over all rounds. Before that, a point counts as worse with a looser rank test (p <=
RANK_P_FLAG: five rounds a side can never reach RANK_P); only a point still worse over the now longer series is
reported (a slow minute of the machine during one side's runs otherwise reads as a regression).

--pin passes `bench --pin` to every bench run (each peer pair's receiver on the upper half of the CPUs, its sender on
the lower half): steadier small-message points on a small machine; the default measures unpinned, as the committed
records are.

No verdict is given (the table is still printed) when the 1-minute load average is above LOAD_LIMIT
when the panel starts, or when other processes took more than FOREIGN_LIMIT cores on average while it
ran (the load average cannot show that: the panel's own two peers keep it near 2).

Exit status: 0 no regression, 1 REGRESSION, 2 usage or build error, 3 no verdict (load).

--tiny: the panel in `bench --tiny` form with one binary (SLOTSTREAM_BIN or build/slotstream) as both
sides, 2 rounds (1 to confirm), no build: the test of this script's parsing and verdict (tests/integration/
test_perf_ab.py); its figures mean nothing.
"""
import argparse
import dataclasses
import json
import math
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOAD_LIMIT = 1.5  # 1-minute load average above which no verdict is given
FOREIGN_LIMIT = 0.5  # cores other processes may use on average during the panel
SPREAD_FLOOR = 0.03  # a difference below 3 % is never a verdict, however close the A/A rounds fell
# The rank rule (verdict): HEAD's rounds rank worse than BASE's with a one-sided exact Mann-Whitney p at most RANK_P
# (RANK_P_FLAG before the confirming rounds), and the medians differ by at least RANK_EFFECT. With 9 rounds a side
# (5 + 4 confirming) and rounds drawn half from each of two modes a factor 2 apart, a simulated halving was reported
# in about half of the runs (the spread rule: 1 in 400) and equal binaries in none of 1,000. RANK_EFFECT: two builds
# of one source, measured against each other, had a point 14 % apart in all 9 rounds (docs/benchmarks.md) — a
# difference the code did not make, which the rank rule must not call a regression.
RANK_P = 0.002
RANK_P_FLAG = 0.05
RANK_EFFECT = 0.15
NO_REGRESSION = "perf-ab: no regression (beyond the A/A spread, or by rank)"
LOAD_WAIT_S = 180  # how long to wait for the load to fall to LOAD_LIMIT before starting

# The panel: the bench runs each round makes for each side (name, arguments). Each writes its own
# results.json; the points below are read from them.
KIB, MIB = 1024, 1 << 20
THROUGHPUT_SIZES = (64 * KIB, MIB)
BLOCKS = (3, 32)
RATE_SIZES = (64, 256)
PANEL = [
    ("latency", ["latency", "--transport", "shm", "--sizes", "64", "--protocols", "status_byte"]),
    ("rate", ["message_rate", "--transport", "shm", "--sizes", ",".join(map(str, RATE_SIZES)),
              "--protocols", "status_byte"]),
    ("tput-shm", ["throughput", "--transport", "shm", "--sizes", ",".join(map(str, THROUGHPUT_SIZES)),
                  "--protocols", "status_byte"]),
    ("tput-tcp", ["throughput", "--transport", "tcp", "--sizes", ",".join(map(str, THROUGHPUT_SIZES)),
                  "--protocols", "status_byte"]),
]
MODE_ARGS = {"full": ["--quick", "--repeats", "10", "--runs", "1"], "tiny": ["--tiny", "--runs", "1"]}


# ----------------------------------------------------------------------------- reading the records

def value(records, experiment, protocol, transport, size, metric, blocks=None, devices=None):
    """The median of the matching records of one bench run (throughput has one per round), or None."""
    vals = [r["value"] for r in records
            if r["experiment"] == experiment and r["protocol"] == protocol and r["transport"] == transport
            and r["size_bytes"] == size and r["metric"] == metric and not r.get("variant")
            and (blocks is None or r["blocks"] == blocks) and (devices is None or r.get("devices", 1) == devices)]
    return statistics.median(vals) if vals else None


def ratio(a, b):
    return a / b if a is not None and b else None


@dataclasses.dataclass(frozen=True)
class Point:
    """One line of the table: `get(records of one side's round, by panel run name)` -> a value or None."""
    label: str
    unit: str
    better: str  # "higher" or "lower"
    get: Callable
    run: str  # the panel's bench run (PANEL's name) it is read from


def size_name(s):
    return f"{s // MIB} MiB" if s >= MIB and s % MIB == 0 else f"{s // KIB} KiB" if s >= KIB else f"{s} B"


def points():
    out = []
    lat = lambda R, p: value(R.get("latency", []), "latency", p, "shm", 64, "latency_p50")  # noqa: E731
    out.append(Point("shm 64 B latency p50", "us", "lower", lambda R: lat(R, "status_byte"), "latency"))
    out.append(Point("  / ucx_perftest put_lat", "x", "lower",
                     lambda R: ratio(lat(R, "status_byte"), lat(R, "ucx_raw_put")), "latency"))
    for s in RATE_SIZES:
        def rate(R, p, s=s):
            return value(R.get("rate", []), "message_rate", p, "shm", s, "message_rate", devices=1)
        out.append(Point(f"shm {size_name(s)} rate, 1 device", "M msg/s", "higher",
                         lambda R, rate=rate: (lambda v: v and v / 1e6)(rate(R, "status_byte")), "rate"))
        out.append(Point("  / ucx_perftest put_bw", "x", "higher",
                         lambda R, rate=rate: ratio(rate(R, "status_byte"), rate(R, "ucx_perftest_put_bw")), "rate"))
    for t in ("shm", "tcp"):
        for b in BLOCKS:
            for s in THROUGHPUT_SIZES:
                def tput(R, p, t=t, b=b, s=s):
                    return value(R.get(f"tput-{t}", []), "throughput", p, t, s, "throughput", blocks=b)
                out.append(Point(f"{t} {size_name(s)} x{b} throughput", "MB/s", "higher",
                                 lambda R, tput=tput: tput(R, "status_byte"), f"tput-{t}"))
                out.append(Point("  / ucx_raw_put", "x", "higher",
                                 lambda R, tput=tput: ratio(tput(R, "status_byte"), tput(R, "ucx_raw_put")),
                                 f"tput-{t}"))
                if t == "tcp":
                    out.append(Point("  / tcp_socket", "x", "higher",
                                     lambda R, tput=tput: ratio(tput(R, "status_byte"), tput(R, "tcp_socket")),
                                     f"tput-{t}"))
    for t in ("shm", "tcp"):
        for b in BLOCKS:
            for s in THROUGHPUT_SIZES:
                for side in ("receiver", "sender"):
                    out.append(Point(f"{t} {size_name(s)} x{b} {side} CPU", "ms/MB", "lower",
                                     lambda R, t=t, b=b, s=s, side=side: value(
                                         R.get(f"tput-{t}", []), "cpu", "status_byte", t, s, f"cpu_{side}_per_mb",
                                         blocks=b), f"tput-{t}"))
    return out


# ----------------------------------------------------------------------------- the verdict

def rank_p(worse, other, better):
    """The exact one-sided Mann-Whitney p that the values `worse` rank worse than `other` (lower where `better` is
    "higher"): the chance, were both drawn alike, of at most as many (w, o) pairs in which w is no worse than o. A tie
    counts as no worse (the conservative side). Exact by counting arrangements: a side has at most a few tens of
    rounds."""
    n, m = len(worse), len(other)
    no_worse = sum((w >= o) if better == "higher" else (w <= o) for w in worse for o in other)
    # ways[u]: the arrangements of n values among m with u pairs in the first's favour (the null distribution).
    ways = [[1] + [0] * (n * m) for _ in range(m + 1)]  # ways for (i values, j values); start: i = 0
    for i in range(1, n + 1):
        nxt = [[0] * (n * m + 1) for _ in range(m + 1)]
        nxt[0][0] = 1
        for j in range(1, m + 1):
            for u in range(n * m + 1):
                # The largest of the i + j values is one of the i (it beats all j) or one of the j.
                nxt[j][u] = (nxt[j - 1][u]) + (ways[j][u - j] if u >= j else 0)
        ways = nxt
    return sum(ways[m][: no_worse + 1]) / math.comb(n + m, n)


def verdict(base, head, better, floor=SPREAD_FLOOR, p_limit=RANK_P):
    """(HEAD/BASE of the medians, A/A spread, rank p, word) for one point's per-round values of each side.
    The spread is max/min - 1 over BASE's rounds; p: rank_p of HEAD's rounds against BASE's. Word: REGRESSION
    where HEAD is worse beyond max(spread, floor), or ranks worse (p <= p_limit) with medians at least RANK_EFFECT
    apart; better the same way round; else ok. n/a when either side has no value or BASE has fewer than two rounds."""
    base = [v for v in base if v is not None]
    head = [v for v in head if v is not None]
    if not base or not head:
        return None, None, None, "n/a"
    b, h = statistics.median(base), statistics.median(head)
    r = h / b if b else None
    if len(base) < 2 or r is None or min(base) <= 0:
        return r, None, None, "n/a"
    spread = max(base) / min(base) - 1
    limit = max(spread, floor)
    p = rank_p(head, base, better)
    p_gain = rank_p(base, head, better)
    up, down = r > 1 + RANK_EFFECT, r < 1 - RANK_EFFECT
    if better == "higher":
        worse = r < 1 - limit or (p <= p_limit and down)
        gain = r > 1 + limit or (p_gain <= p_limit and up)
    else:
        worse = r > 1 + limit or (p <= p_limit and up)
        gain = r < 1 - limit or (p_gain <= p_limit and down)
    return r, spread, p, "REGRESSION" if worse else "better" if gain else "ok"


def table(pts, rounds, p_limit=RANK_P):
    """rounds: {"BASE": [records by panel run name, per round], "HEAD": [...]}. Returns (lines, regressions,
    rows) where rows holds every point's values for the JSON record. p_limit: the rank rule's (verdict)."""
    lines = [f"{'point':38} {'unit':8} {'BASE':>10} {'HEAD':>10} {'HEAD/BASE':>9} {'A/A':>7} {'p':>6}  verdict"]
    regressions, rows = [], []
    section = ""
    for p in pts:
        if not p.label.startswith("  "):
            section = p.label
        base = [p.get(R) for R in rounds["BASE"] if p.run in R]  # confirming rounds make only some runs
        head = [p.get(R) for R in rounds["HEAD"] if p.run in R]
        r, spread, rank, word = verdict(base, head, p.better, p_limit=p_limit)
        bm = statistics.median([v for v in base if v is not None]) if any(v is not None for v in base) else None
        hm = statistics.median([v for v in head if v is not None]) if any(v is not None for v in head) else None
        lines.append(f"{p.label:38} {p.unit:8} {fmt(bm):>10} {fmt(hm):>10} "
                     f"{('%.3f' % r) if r is not None else '–':>9} "
                     f"{('±%.0f%%' % (100 * spread)) if spread is not None else '–':>7} "
                     f"{('%.3f' % rank) if rank is not None else '–':>6}  {word}")
        name = p.label if not p.label.startswith("  ") else f"{section} {p.label.strip()}"
        if word == "REGRESSION":
            regressions.append(name)
        rows.append({"point": name, "run": p.run, "unit": p.unit, "better": p.better, "base": base, "head": head,
                     "ratio": r, "spread": spread, "p_worse": rank, "verdict": word})
    return lines, regressions, rows


def runs_to_confirm(rows):
    """The panel's bench runs (in PANEL's order) behind the points `table` found worse (its rows)."""
    wanted = {r["run"] for r in rows if r["verdict"] == "REGRESSION"}
    return [name for name, _ in PANEL if name in wanted]


def fmt(v):
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def overall(regressions, load_start, foreign, rounds_n):
    """(exit status, the verdict line)."""
    why = []
    if load_start is not None and load_start > LOAD_LIMIT:
        why.append(f"the 1-minute load average was {load_start:.2f} (> {LOAD_LIMIT}) when the panel started")
    if foreign is not None and foreign > FOREIGN_LIMIT:
        why.append(f"other processes used {foreign:.2f} cores on average while it ran (> {FOREIGN_LIMIT})")
    if rounds_n < 2:
        why.append("one round gives no A/A spread")
    if why:
        return 3, "perf-ab: NO VERDICT: " + "; ".join(why) + " — the figures above are not evidence; rerun quiet"
    if regressions:
        return 1, f"perf-ab: REGRESSION at {len(regressions)} point(s): " + "; ".join(regressions)
    return 0, NO_REGRESSION


# ----------------------------------------------------------------------------- the machine

def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def busy_seconds():
    """CPU seconds the whole machine has been busy (every core, steal included: a VM's neighbours)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds():
    """CPU of this process and its reaped descendants (the bench runs and their peers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def wait_for_load(limit, seconds, log):
    start = time.monotonic()
    while load1() > limit and time.monotonic() - start < seconds:
        if int(time.monotonic() - start) % 30 == 0:
            log(f"perf-ab: waiting for the load average ({load1():.2f}) to fall to {limit} "
                f"(at most {seconds - int(time.monotonic() - start)} s more)")
        time.sleep(1)
    return load1()


# ----------------------------------------------------------------------------- builds

def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def build_env():
    env = dict(os.environ)
    if shutil.which("ccache") and "CMAKE_CXX_COMPILER_LAUNCHER" not in env:
        env.update(CMAKE_CXX_COMPILER_LAUNCHER="ccache", CMAKE_C_COMPILER_LAUNCHER="ccache")
        env.setdefault("CCACHE_BASEDIR", str(ROOT.parent))
        env.setdefault("CCACHE_NOHASHDIR", "1")
    return env


def build(src, log):
    """Configures src/build like scripts/build.sh when it has no cache, builds the CLI only; returns the binary."""
    bdir = src / "build"
    env = build_env()
    if not (bdir / "CMakeCache.txt").exists():
        py = ["-DPython3_EXECUTABLE=/usr/bin/python3"] if os.path.exists("/usr/bin/python3") else []
        run_build(["cmake", "-S", str(src), "-B", str(bdir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo", *py],
                  env, log)
    t0 = time.monotonic()
    run_build(["cmake", "--build", str(bdir), "--target", "slotstream_cli"], env, log)
    log(f"perf-ab: built {bdir / 'slotstream'} ({build_type(bdir)}) in {time.monotonic() - t0:.0f} s")
    return bdir / "slotstream"


def run_build(cmd, env, log):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        log((p.stdout + p.stderr)[-3000:])
        raise SystemExit(f"perf-ab: build failed: {' '.join(cmd)}")


def build_type(bdir):
    try:
        for line in (bdir / "CMakeCache.txt").read_text().splitlines():
            if line.startswith("CMAKE_BUILD_TYPE:"):
                return line.split("=", 1)[1] or "no build type"
    except OSError:
        pass
    return "unknown build type"


def checkout(rev, log):
    """A worktree of `rev` under build-ab/ (made once per commit); returns (its path, the commit)."""
    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"perf-ab: error: {rev!r} is not a commit of this repository")
    wt = ROOT / "build-ab" / f"src-{sha[:12]}"
    if not (wt / ".git").exists():
        git("worktree", "prune")
        log(f"perf-ab: checking out {rev} ({sha[:12]}) in {wt.relative_to(ROOT)}")
        git("worktree", "add", "--detach", "--force", str(wt), sha)
    return wt, sha


# ----------------------------------------------------------------------------- measuring

def bench(harness, binary, args, out, log_file):
    """One `slotstream bench` run of the harness with `binary` measuring; returns its records ([] if none)."""
    if out.exists():
        shutil.rmtree(out)
    env = dict(os.environ, SLOTSTREAM_BIN=str(binary))
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    # perf-ab judges the load itself (no verdict above 1.5 at its start); its own alternated runs keep the
    # load average up, so the harness's gate, where it has one, is passed.
    script = harness / "slotstream_bench.py"
    force = ["--force"] if "--force" in script.read_text() else []
    with open(log_file, "w") as f:
        rc = subprocess.run([python, str(script), *args, *force, "--out", str(out)], env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    try:
        data = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return [], [f"no results.json (exit {rc}); see {log_file}"]
    return data.get("records", []), [f"{e}" for e in data.get("errors", [])]


def main(argv):
    ap = argparse.ArgumentParser(prog="scripts/perf-ab.sh", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", nargs="?", help="the commit to compare against (e.g. main)")
    ap.add_argument("head", nargs="?", help="the commit to measure (default: the working tree, built in build/)")
    ap.add_argument("--rounds", type=int, help="rounds of the panel per side (default 5; --tiny 2)")
    ap.add_argument("--confirm", type=int,
                    help="extra rounds of the bench runs behind a point found worse, before it is called a REGRESSION "
                         "(default 4; --tiny 1; 0: the first verdict stands)")
    ap.add_argument("--pin", action="store_true",
                    help="pass --pin to every bench run: each peer pair's receiver on the upper half of the CPUs, its "
                         "sender on the lower half (steadier small-message rates on a small machine; default unpinned)")
    ap.add_argument("--build-only", action="store_true", help="build both sides and stop (run it under `heavy`)")
    ap.add_argument("--no-wait", action="store_true", help="start at once whatever the load")
    ap.add_argument("--tiny", action="store_true", help="one binary as both sides, the panel in tiny form, no build "
                                                        "(the test of this script; figures mean nothing)")
    a = ap.parse_args(argv)
    rounds_n = a.rounds or (2 if a.tiny else 5)
    if rounds_n < 1:
        ap.error("--rounds must be at least 1")
    confirm_n = a.confirm if a.confirm is not None else (1 if a.tiny else 4)
    if confirm_n < 0:
        ap.error("--confirm must be 0 or more")
    if not a.tiny and not a.base:
        ap.error("give BASE (e.g. main)")

    def log(msg):
        print(msg, flush=True)

    out_dir = ROOT / "build-ab" / "last"
    if a.tiny:
        binary = pathlib.Path(os.environ.get("SLOTSTREAM_BIN", ROOT / "build" / "slotstream"))
        if not binary.exists():
            raise SystemExit(f"perf-ab: error: no binary at {binary} (build first, or set SLOTSTREAM_BIN)")
        sides = {"BASE": binary, "HEAD": binary}
        names = {"BASE": f"{binary} (A/A)", "HEAD": f"{binary} (A/A)"}
        harness = ROOT / "bench"
        out_dir = pathlib.Path(os.environ.get("PERF_AB_OUT", out_dir.parent / "tiny"))
    else:
        base_src, base_sha = checkout(a.base, log)
        sides = {"BASE": build(base_src, log)}
        names = {"BASE": f"{a.base} ({base_sha[:12]})"}
        if a.head:
            head_src, head_sha = checkout(a.head, log)
            names["HEAD"] = f"{a.head} ({head_sha[:12]})"
        else:
            head_src = ROOT
            dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
            names["HEAD"] = f"working tree ({git('rev-parse', '--short=12', 'HEAD')}{' + changes' if dirty else ''})"
        sides["HEAD"] = build(head_src, log)
        harness = head_src / "bench"
        types = {k: build_type(v.parent) for k, v in sides.items()}
        if types["BASE"] != types["HEAD"]:
            log(f"perf-ab: WARNING: the builds differ in type: BASE {types['BASE']}, HEAD {types['HEAD']}")
        if a.build_only:
            return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = "tiny" if a.tiny else "full"
    extra = ["--pin"] if a.pin else []
    if a.pin and "--pin" not in (harness / "slotstream_bench.py").read_text():
        raise SystemExit(f"perf-ab: error: the harness in {harness} has no --pin (HEAD predates it)")

    load_start = load1() if a.no_wait else wait_for_load(LOAD_LIMIT, LOAD_WAIT_S, log)
    log(f"perf-ab: BASE {names['BASE']} vs HEAD {names['HEAD']}: {rounds_n} round(s) of {len(PANEL)} bench runs "
        f"per side, alternating{', pinned (--pin)' if a.pin else ''}; 1-minute load {load_start:.2f}; harness {harness}")
    rounds = {"BASE": [], "HEAD": []}
    errors = []
    t0 = time.monotonic()
    busy0, own0 = busy_seconds(), own_seconds()

    def run_rounds(first, last, panel):
        """Rounds first..last (1-based, inclusive) of the `panel` runs, each side's in turn."""
        for r in range(first - 1, last):
            for side in ("BASE", "HEAD"):
                rounds[side].append({})
            for name, args in panel:
                order = ("BASE", "HEAD") if r % 2 == 0 else ("HEAD", "BASE")
                for side in order:
                    t1 = time.monotonic()
                    recs, errs = bench(harness, sides[side], args + MODE_ARGS[mode] + extra,
                                       out_dir / f"r{r + 1}-{side.lower()}-{name}",
                                       out_dir / f"r{r + 1}-{side.lower()}-{name}.log")
                    rounds[side][r][name] = recs
                    errors.extend(f"round {r + 1} {side} {name}: {e}" for e in errs)
                    log(f"[{time.monotonic() - t0:5.0f} s] round {r + 1}/{last} {side} {name:8} "
                        f"{len(recs):4} records{', ' + str(len(errs)) + ' error(s)' if errs else ''} "
                        f"({time.monotonic() - t1:.0f} s)")

    run_rounds(1, rounds_n, PANEL)
    # Confirming rounds to come: a point counts as worse on the looser rank test first (RANK_P_FLAG).
    lines, regressions, rows = table(points(), rounds, RANK_P_FLAG if confirm_n > 0 else RANK_P)
    confirm = runs_to_confirm(rows)  # empty with one round: no spread, no REGRESSION
    confirmed_rounds = 0
    if confirm and confirm_n > 0:
        log(f"perf-ab: worse (beyond the spread, or by rank): {'; '.join(regressions)}; {confirm_n} more round(s) of "
            f"{', '.join(confirm)} before a verdict")
        run_rounds(rounds_n + 1, rounds_n + confirm_n, [(n, args) for n, args in PANEL if n in confirm])
        confirmed_rounds = confirm_n
    lines, regressions, rows = table(points(), rounds)  # the verdict: RANK_P, over every round
    wall = time.monotonic() - t0
    foreign = max(0.0, (busy_seconds() - busy0) - (own_seconds() - own0)) / max(wall, 1e-9)
    log("")
    log(f"perf-ab: BASE {names['BASE']}, HEAD {names['HEAD']}; medians of {rounds_n} alternated rounds"
        f"{f' ({rounds_n + confirmed_rounds} for ' + ', '.join(confirm) + ')' if confirmed_rounds else ''}, "
        f"A/A = max/min - 1 over BASE's rounds; p = one-sided rank test that HEAD is worse")
    for line in lines:
        log(line)
    for e in errors:
        log(f"perf-ab: bench error: {e}")
    log(f"perf-ab: {wall:.0f} s; 1-minute load {load_start:.2f} at the start, {load1():.2f} at the end "
        f"(the panel's own peers raise it); other processes used {foreign:.2f} cores on average")
    status, line = overall(regressions, load_start, foreign, rounds_n)
    log(line)
    (out_dir / "perf-ab.json").write_text(json.dumps(
        {"base": names["BASE"], "head": names["HEAD"], "rounds": rounds_n, "confirm_rounds": confirmed_rounds,
         "confirmed_runs": confirm if confirmed_rounds else [], "mode": mode, "pin": a.pin, "load_start": load_start,
         "foreign_cores": foreign, "seconds": wall, "errors": errors, "points": rows, "verdict": line}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
