"""Idle and stalled peers cost (almost) no CPU (issue 13): a receiver with many accepted but idle sessions
sleeps, and a sender whose receiver stopped mid-stream waits without spinning — then finishes, every message
verified. CPU is what the kernel charged the process (/proc/PID/stat utime + stime, every thread)."""
import json
import os
import pathlib
import signal
import time

import pytest

from conftest import FINISHED_RE, parse_finished, run_verify, send_argv, wait_until

TICKS = os.sysconf("SC_CLK_TCK")
SESSIONS = 50
WINDOW = 3.0  # seconds of CPU measured


def cpu_seconds(pid):
    """User + system CPU of every thread of a process so far."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime and stime: fields 14 and 15 of proc(5)


def cpu_share(pid, seconds=WINDOW):
    """Fraction of one core the process used over the next `seconds`."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


# Why 15 % of one core: an idle session's consumer sleeps 20 ms between looks once idle for 100 ms
# (src/engine/ucx/session/receiver_session.h, idle_nap), so 50 idle sessions cost 3-6 % of a core here (less under
# load: the naps only get longer). A consumer that polled every millisecond instead costs 25 % (status_byte)
# and 43 % (sliding_window, a UCX worker per session) with the same 50 sessions — measured with
# kLongIdleSleep set to 1 ms — and a busy-polling one a core per session: neither fits under the bound,
# which leaves the sleeping receiver more than twice its cost for a loaded machine.
IDLE_RECEIVER_BOUND = 0.15


@pytest.mark.deadline(120)
@pytest.mark.parametrize("protocol", ["status_byte", "sliding_window"])
def test_a_receiver_with_fifty_idle_sessions_sleeps(receiver, spawn, tmp_path, protocol):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "shm")
    # One synthetic frame now, the next in 20 s: every session is accepted, delivers its first message and
    # is then idle for the whole measurement. status_byte: 50 senders of one device each; sliding_window: one
    # sender of 50 devices, which opens a connection (a session) per device.
    tiny = ["--transport", "shm", "--protocol", protocol, "--blocks", "2", "--block-size", "4096",
            "--duration", "60"]
    if protocol == "sliding_window":
        spawn(send_argv(rx.addr, "--name", "idle", "--synthetic", f"0-{SESSIONS - 1}:0.05:16x1x1", *tiny))
        firsts = [out / "idle" / f"device-{d}" / "0000000000.bin" for d in range(SESSIONS)]
    else:
        for i in range(SESSIONS):
            spawn(send_argv(rx.addr, "--name", f"idle{i}", "--synthetic", "0:0.05:16x1x1", *tiny))
        firsts = [out / f"idle{i}" / "device-0" / "0000000000.bin" for i in range(SESSIONS)]
    wait_until(lambda: all(f.exists() for f in firsts), 60, f"the first message of all {SESSIONS} sessions")
    time.sleep(1.0)  # every consumer past kLongIdle, on its longest nap; the senders' set-up is over
    share = cpu_share(rx.pid)
    print(f"{protocol}: receiver with {SESSIONS} idle sessions: {100 * share:.1f} % of a core")
    assert rx.poll() is None, rx.stderr.text
    assert share < IDLE_RECEIVER_BOUND, (
        f"a receiver with {SESSIONS} idle {protocol} sessions used {100 * share:.1f} % of a core over {WINDOW} s "
        f"(bound {100 * IDLE_RECEIVER_BOUND:.0f} %): its consumers poll instead of sleeping")
    stored = sum(1 for _ in out.rglob("*.bin"))
    assert stored == SESSIONS, f"{stored} messages stored: the sessions were not idle during the measurement"


# Issue 19, item 8: 1,000 idle authenticated senders on one receiver cost a small share of a core and under
# 300 MB. With a thread per session that woke every 20 ms they cost 46-55 % (main at 4877430; 200 took 13.9 % in
# the test); parked sessions are looked at by one idle loop every 20 ms: 5.4-6.4 % when that was built,
# 10.2-10.8 % for the same code (e4e3a83) on this 2-core VM in December 2026, and 11.6-13.4 % since every session
# also sends a signed KEEPALIVE each second (control version 8; docs/hardening.md). The bound fails the
# thread-per-session design by 3x without failing a machine whose memory is slower than the one it was set on.
MANY = 1000
MANY_IDLE_CPU_BOUND = 0.15
MANY_IDLE_RSS_BOUND_MIB = 300


@pytest.mark.deadline(120)
def test_a_thousand_idle_authenticated_senders_cost_a_small_share_of_a_core_and_300_mb(receiver, tmp_path):
    import resource
    from idle_senders import open_sender, rss_mib
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * MANY + 1024)), hard))
    token = tmp_path / "token"
    token.write_text("many\n")
    rx = receiver("--discard", "--token-file", token)
    socks = []
    try:
        for i in range(MANY):
            socks.append(open_sender(rx.addr, b"many", f"idle-{i}"))
        time.sleep(1.0)  # every session idle past kParkAfter (100 ms): parked
        share, rss = cpu_share(rx.pid), rss_mib(rx.pid)
        print(f"receiver with {MANY} idle authenticated senders: {100 * share:.1f} % of a core, {rss:.0f} MiB")
        assert rx.poll() is None, rx.stderr.text
        assert share < MANY_IDLE_CPU_BOUND, f"{MANY} idle senders cost {100 * share:.1f} % of a core"
        assert rss < MANY_IDLE_RSS_BOUND_MIB, f"{MANY} idle senders cost {rss:.0f} MiB"
    finally:
        for s in socks:
            s.close()
    # They all end, each reported, and the receiver serves on.
    wait_until(lambda: sum(1 for l in rx.stdout.lines if l.startswith("sender idle-")) == MANY, 60,
               "every idle sender's end to be reported")


# Why 8 % of one core: while its receiver is stopped the sender's blocks are all full and nothing frees one
# (on tcp, reading the receiver's status array needs the receiver's UCX progress thread). The thread that waits for
# the status read sleeps in its worker's event wait, up to 1 ms at a time and 8 ms once the wait has lasted 100 ms
# (fabric Request::wait); fillers waiting for a block sleep 1 ms, doubling to 8 ms while nothing changes
# (stream/send_ring.cc, wait_turn); the sending thread, finding the token taken, naps 20 us doubling to 8 ms
# (session/sender_lane_timing.h, kMaxTokenTakenNap): ~2 % of a core here. With all of them capped at 1 ms it cost
# 10-12 %, with a fixed 20 us nap 9-16 %, with none the sender spins (95 % measured); a fixed poll fails this bound,
# and a sleeping process does not get busier on a loaded machine.
STALLED_SENDER_BOUND = 0.08


@pytest.mark.deadline(120)
def test_a_tcp_sender_whose_receiver_stopped_does_not_spin_and_finishes_after_it_resumes(receiver, spawn,
                                                                                          tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "tcp", "--exit-after-senders", "1")
    devices, fps, seconds = 2, 200, 4
    total = devices * fps * seconds
    tx = spawn(send_argv(rx.addr, "--name", "stalled", "--transport", "tcp", "--blocks", "4", "--block-size",
                         "16384", "--synthetic", f"0-{devices - 1}:{fps}:32x32x3", "--duration", seconds, "--json"))
    stored = lambda: sum(1 for _ in out.rglob("*.bin"))  # noqa: E731
    wait_until(lambda: stored() >= 50, 30, "the first 50 messages")
    rx.signal(signal.SIGSTOP)
    try:
        at_stop = stored()
        assert at_stop < total, "the stream ended before the receiver was stopped"
        time.sleep(0.5)  # four blocks of 200 frames/s per device: the sender is out of blocks long before
        share = cpu_share(tx.pid)
        print(f"sender with its receiver stopped: {100 * share:.1f} % of a core")
        assert tx.poll() is None, f"the sender gave up while its receiver was stopped: {tx.stderr.text}"
        assert stored() == at_stop
    finally:
        rx.signal(signal.SIGCONT)
    assert share < STALLED_SENDER_BOUND, (
        f"a sender whose receiver is stopped used {100 * share:.1f} % of a core over {WINDOW} s "
        f"(bound {100 * STALLED_SENDER_BOUND:.0f} %): it spins instead of waiting")
    assert tx.wait(60) == 0, tx.stderr.text
    assert rx.wait(30) == 0, rx.stderr.text
    line = next(l for l in rx.stdout.lines if FINISHED_RE.match(l))
    report = parse_finished(line)
    # --duration is wall-clock time: the frames whose time passed while the receiver was stopped were
    # counted late, not queued; every frame that was sent is stored, in order.
    sent = json.loads(tx.stdout.lines[-1])
    assert sent["messages"] + sent["late_frames"] == total and sent["late_frames"] > 0, sent
    assert report["messages"] == sent["messages"] and report["gaps"] == 0 and report["duplicates"] == 0, line
    v = run_verify(out)
    assert v.returncode == 0 and f"verified {sent['messages']} frames" in v.stdout, v.stdout + v.stderr
