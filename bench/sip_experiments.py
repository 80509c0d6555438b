"""`slotstream bench sipscale`: SIPp with many clients, memory and response time (issue 25, item 4; the
datagram-iWARP patent: "SIPp was configured to generate a load emulating many clients, which creates a single UDP
port for each client. We find that at 10000 clients, we have a memory savings of 24.1 %", memory being SIPp's
application memory plus the slab space allocated for the sockets; theory 28.1 %).

One point: `sipp -sn uas` and `sipp -sn uac` with one socket per call on the client — UDP (`-t un`, the server
answers on its one socket, `-t u1`) through libslotstream_udp.so on both ends, the same without the shim, or TCP
(`-t tn`: a connection per call, which the server accepts, `-t t1`). The client opens N calls at a bounded rate
and holds each (`-d`) until every one is open; at that plateau we read both processes' VmRSS, /proc/slabinfo's
socket caches (the change since before the point) and /proc/net/sockstat. Memory = RSS(uac) + RSS(uas) + the
slab delta of SOCKET_CACHES. Response time: INVITE -> 200 OK per call from sipp's -trace_rtt file (1 ms
resolution: sipp's clock tick), over every call and over the last tenth (answered with 90 % of the clients open).
A full run does not wait for the held calls to end (it would double the point's time): it reads sipp's
statistics file at the plateau (calls open, failed) and stops both; a tiny run holds the calls briefly and
checks that sipp counted every call successful.

The entry script (slotstream_bench.py) lists EXPERIMENTS beside the other modules' tables.
"""
import csv
import os
import pathlib
import resource
import shutil
import socket
import statistics
import subprocess
import time

import dgram_experiments as dx
from harness import Experiment, PeerError, Progress, for_each_point, free_port, log, pct, wait_or_kill

MODES = ("shim", "udp", "tcp")  # udp+shim, plain udp, tcp: dgram_experiments.APP_TRANSPORT names them
TRANSPORT_ARGS = {"shim": ("un", "u1"), "udp": ("un", "u1"), "tcp": ("tn", "t1")}  # (uac, uas)
# What a socket costs the kernel in slab objects: the protocol's sock (TCP, UDP and their v6 twins), a connection
# request while the server accepts (request_sock_TCP), the socket inode (struct socket + inode), the open file of
# its descriptor (filp), sipp's epoll registration of it (eventpoll_*), TCP's port binding and queued packets'
# sk_buff heads. Left out: dentry (one per socket file too, but the cache holds ~10^6 objects that other
# processes' builds churn: recorded as slab_dentry_kib, not summed), kmalloc-* (shared by everything), and
# tw_sock_TCP (connections of an earlier point in TIME_WAIT, no client's).
SOCKET_CACHES = ("UDP", "UDPv6", "TCP", "TCPv6", "request_sock_TCP", "sock_inode_cache", "filp", "eventpoll_epi",
                 "eventpoll_pwq", "tcp_bind_bucket", "skbuff_head_cache", "skbuff_small_head")
NOT_SUMMED = ("dentry",)
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def settings(cfg):
    """(clients, calls per second, seconds the ramp may take at most, whether to wait for the calls to end)."""
    return {"tiny": (50, 200, 10, True), "quick": (1000, 500, 20, False), "full": (10000, 300, 55, False)}[dx.mode(cfg)]


# ----------------------------------------------------------------------------- what the kernel and sipp say


def slabinfo():
    """{cache: (active objects, object size)} of /proc/slabinfo (readable by root only)."""
    try:
        lines = pathlib.Path("/proc/slabinfo").read_text().splitlines()[2:]
    except OSError as e:
        raise PeerError(f"cannot read /proc/slabinfo ({e}): sipscale measures the kernel's socket memory, run as "
                        "root") from None
    out = {}
    for line in lines:
        f = line.split()
        out[f[0]] = (int(f[1]), int(f[3]))
    return out


def slab_delta_kib(before, after, caches):
    """{cache: KiB of active objects added between the two readings}."""
    return {c: ((after.get(c, (0, 0))[0] - before.get(c, (0, 0))[0]) * after.get(c, before.get(c, (0, 0)))[1]) / 1024
            for c in caches}


def sockstat_mem_pages():
    """The pages the kernel has charged to TCP and to UDP sockets (/proc/net/sockstat `mem`, system-wide)."""
    pages = 0
    for line in pathlib.Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith(("TCP:", "UDP:")):
            f = line.split()
            pages += int(f[f.index("mem") + 1]) if "mem" in f else 0
    return pages


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise PeerError(f"process {pid} has no VmRSS")


def socket_count(pid):
    """Descriptors of process pid that are sockets (0 once it has gone)."""
    n = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def last_stats(path):
    """The last row of sipp's -trace_stat file as {column: text} ({} before sipp wrote one)."""
    try:
        rows = list(csv.reader(path.read_text().splitlines(), delimiter=";"))
    except OSError:
        return {}
    return dict(zip(rows[0], rows[-1])) if len(rows) > 1 else {}


def plateau_stats(path, clients, seconds=2.5):
    """sipp's statistics once they count every client's call open (a row a second), or the last row after
    `seconds`: the last calls' 200 OK and ACK have been exchanged by then."""
    deadline = time.monotonic() + seconds
    while True:
        row = last_stats(path)
        if float(row.get("CurrentCall", 0) or 0) >= clients or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


def response_times(workdir):
    """INVITE -> 200 OK of each call in the order answered (ms), from uac's -trace_rtt files."""
    times = []
    for f in workdir.glob("uac_*_rtt.csv"):
        for line in f.read_text().splitlines()[1:]:
            parts = line.split(";")
            if len(parts) >= 2:
                times.append(float(parts[1]))
    return times


# ----------------------------------------------------------------------------- one point


def raise_nofile():
    """In the child: the soft limit of descriptors up to the hard one (a socket per client)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def fitting_clients(clients):
    """The clients the descriptor limit allows: each process holds one socket per call (TCP) plus a few."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < clients + 200:
        log(f"  (sipscale: RLIMIT_NOFILE's hard limit is {hard}: {hard - 200} clients instead of {clients})")
        return hard - 200
    return clients


def start_sipp(mode, clients, rate, hold_s, ramp_s, workdir):
    """The server, then the client; returns (uas, uac, statistics file)."""
    kind = socket.SOCK_STREAM if mode == "tcp" else socket.SOCK_DGRAM
    uas_port, uac_port = free_port(kind), free_port(kind)
    uac_t, uas_t = TRANSPORT_ARGS[mode]
    env = dx.app_env(mode, uas_port)  # every SIP datagram goes to or comes from the server's port
    common = ["-nostdin", "-i", "127.0.0.1", "-max_socket", clients + 100, "-timeout", f"{hold_s + ramp_s + 30}s"]
    uas = subprocess.Popen([str(a) for a in ["sipp", "-sn", "uas", "-p", uas_port, "-t", uas_t, *common]], env=env,
                           cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=raise_nofile)
    deadline = time.monotonic() + 10
    while socket_count(uas.pid) == 0 and uas.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = workdir / f"stat-{mode}.csv"
    uac = subprocess.Popen([str(a) for a in [
        "sipp", "-sn", "uac", f"127.0.0.1:{uas_port}", "-p", uac_port, "-t", uac_t, *common, "-m", clients, "-l",
        clients, "-r", rate, "-d", int(hold_s * 1000), "-trace_stat", "-fd", 1, "-stf", stats, "-trace_rtt",
        "-rtt_freq", 50]], env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=(workdir / "uac.err").open("wb"),
        preexec_fn=raise_nofile)
    return uas, uac, stats


def wait_plateau(mode, uas, uac, clients, ramp_s, workdir):
    """Waits until the client holds a socket per call (or ramp_s passed); prints progress every 5 s. Returns
    (seconds the ramp took, the client's sockets)."""
    t0 = time.monotonic()
    shown = t0
    while True:
        n = socket_count(uac.pid)
        now = time.monotonic()
        if n >= clients or now - t0 > ramp_s:
            return now - t0, n
        if uac.poll() is not None or uas.poll() is not None:
            who, p = ("uac", uac) if uac.poll() is not None else ("uas", uas)
            err = (workdir / "uac.err").read_text(errors="replace")[-300:]
            raise PeerError(f"sipp {who} ({mode}) ended during the ramp (exit {p.returncode}): {err}")
        if now - shown >= 5:
            log(f"    sipscale {dx.APP_TRANSPORT[mode]}: {n:,} of {clients:,} client sockets open, {now - t0:.0f} s")
            shown = now
        time.sleep(0.25)


def stop_sipp(procs, wait_s):
    for p in procs:
        wait_or_kill(p, wait_s)


def measure_point(mode, clients, rate, ramp_s, finish, workdir):
    """One point: {metric: value} at the plateau (and sipp's final counts when `finish`)."""
    for f in workdir.glob("uac_*"):
        f.unlink()
    # Calls are held past the longest ramp allowed; a run that does not finish stops them at the plateau.
    hold_s = 3.0 if finish else ramp_s + 10  # tiny: a statistics row (one a second) while all are open
    if not finish:
        time.sleep(2)  # the sockets of a point stopped just before are freed after an RCU grace period, or later
    slab0, mem0 = slabinfo(), sockstat_mem_pages()
    uas, uac, stats = start_sipp(mode, clients, rate, hold_s, ramp_s, workdir)
    try:
        ramp, _ = wait_plateau(mode, uas, uac, clients, ramp_s, workdir)
        plateau = plateau_stats(stats, clients)
        got = {"rss_uac_kib": rss_kib(uac.pid), "rss_uas_kib": rss_kib(uas.pid), "ramp_seconds": ramp,
               "uac_sockets": socket_count(uac.pid), "uas_sockets": socket_count(uas.pid)}
        slab1, mem1 = slabinfo(), sockstat_mem_pages()
        stop_sipp([uac], hold_s + 20 if finish else 0)  # the server ends with the client
    finally:
        stop_sipp([uac, uas], 0)
    delta = slab_delta_kib(slab0, slab1, SOCKET_CACHES + NOT_SUMMED)
    got.update({f"slab_{c}_kib": v for c, v in delta.items()})
    got["slab_kib"] = sum(delta[c] for c in SOCKET_CACHES)
    got["sockstat_mem_kib"] = (mem1 - mem0) * PAGE_KIB
    got["memory_kib"] = got["rss_uac_kib"] + got["rss_uas_kib"] + got["slab_kib"]
    got["calls_open"] = float(plateau.get("CurrentCall", 0))
    final = last_stats(stats) if finish else plateau
    got["calls_failed"] = float(final.get("FailedCall(C)", 0))
    if finish:
        got["calls_successful"] = float(final.get("SuccessfulCall(C)", 0))
    got["memory_per_client_kib"] = got["memory_kib"] / max(got["calls_open"], 1)
    times = response_times(workdir)
    if times:
        tail = times[-max(1, len(times) // 10):]
        got.update(sip_response_mean=statistics.mean(times), sip_response_p50=pct(times, 50),
                   sip_response_p99=pct(times, 99), sip_response_p50_last_tenth=pct(tail, 50),
                   sip_response_p99_last_tenth=pct(tail, 99))
    return got


UNITS = {"_kib": "KiB", "_seconds": "s", "sip_response": "ms"}


def unit_of(metric):
    return next((u for k, u in UNITS.items() if k in metric), "count")


def sipscale_point(res, mode, clients, rate, ramp_s, finish, workdir):
    t = dx.APP_TRANSPORT[mode]
    try:
        got = measure_point(mode, clients, rate, ramp_s, finish, workdir)
    except subprocess.TimeoutExpired as e:
        raise PeerError(str(e)) from None
    for metric, v in got.items():
        res.add("sipscale", "sipp", t, clients, 1, metric, v, unit_of(metric))
    return (f"sipp {t:9} {got['calls_open']:>6.0f} of {clients} calls open after {got['ramp_seconds']:4.1f} s: "
            f"RSS {got['rss_uac_kib'] / 1024:.1f} + {got['rss_uas_kib'] / 1024:.1f} MiB, socket slab "
            f"{got['slab_kib'] / 1024:.1f} MiB, total {got['memory_kib'] / 1024:.1f} MiB, "
            f"{got['calls_failed']:.0f} failed")


def exp_sipscale(res, cfg):
    if not shutil.which("sipp") or not dx.shim_path().exists():
        res.error("sipscale", f"needs {'sipp' if not shutil.which('sipp') else dx.shim_path()} "
                              "(scripts/setup.sh, scripts/build.sh)")
        return
    if cfg.tiny and res.run > 0:
        return  # a tiny run (the tests') measures its 3 points once: ~10 s of sipp each time
    if not os.access("/proc/slabinfo", os.R_OK):
        why = "it reads /proc/slabinfo, which only root may"
        if cfg.tiny:
            log(f"  (sipscale skipped in this tiny run: {why})")
        else:
            res.error("sipscale", f"{why}: run it as root")
        return
    clients, rate, ramp_s, finish = settings(cfg)
    clients = fitting_clients(clients)
    workdir = pathlib.Path(res.out) / "sipscale-work"
    workdir.mkdir(parents=True, exist_ok=True)
    prog = Progress(len(MODES), "sipscale", res.run, cfg.runs)
    for_each_point(res, cfg, "sipscale", [(m,) for m in MODES],
                   lambda m: sipscale_point(res, m, clients, rate, ramp_s, finish, workdir),
                   lambda m: f"{dx.APP_TRANSPORT[m]} {clients} clients", prog=prog)
    add_savings(res, clients)
    shutil.rmtree(workdir, ignore_errors=True)


def add_savings(res, clients):
    """The patent's figure within this run: 1 - memory(UDP) / memory(TCP), with and without the shim."""
    mem = {r["transport"]: r["value"] for r in res.records
           if r["experiment"] == "sipscale" and r["metric"] == "memory_kib" and r["run"] == res.run}
    for t in ("udp+shim", "udp"):
        if mem.get("tcp") and t in mem:
            res.add("sipscale", "sipp", t, clients, 1, "memory_saving_vs_tcp", 1 - mem[t] / mem["tcp"], "ratio")


EXPERIMENTS = {
    "sipscale": Experiment("patent 19", "SIPp with 10,000 clients, a socket each: memory (RSS + socket slab) and "
                                        "response time, UDP through the shim vs UDP vs TCP", exp_sipscale),
}
