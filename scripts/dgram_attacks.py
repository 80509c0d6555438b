#!/usr/bin/env python3
"""Measures what issue 19's attacks cost the datagram receiver (`slotstream recv --transport udp`): the receiver's
RSS, CPU and answers, for one or more binaries, alternating them, N runs each. docs/hardening.md has the results.

  python3 scripts/dgram_attacks.py [--runs 3] [--only NAME] BIN [BIN ...]   (e.g. an old build and build/slotstream;
                                                                 BIN:token runs `throughput` with --token-file)

  hello     one write_record HELLO of 4,096 devices x ring 256 (8 KB), then nine more: RSS, CPU, reply bytes
  partials  dgram_rd, 4,096 devices x ring 19: the first byte (at the end of a 1 MiB region) of 77,824 messages,
            never the rest; RSS 2 s later, and 8 s later (--session-timeout 5 s) with the session kept alive;
            the default --max-memory (partials) and one that lets the hello in (partials-allowed)
  sessions  1,100 hellos from one socket (a QP each) in ~0.1 s, then a real `send`: does it get in?
  garbage   300,000 HELLOs with a right CRC that do not decode: stderr lines, receiver CPU
  throughput  no attack: `dgram-peer` write_record 1 MiB x 400 and dgram_rd 64 KiB x 2,000 on loopback, MB/s and
            CPU of both ends (what the MAC of an authenticated session costs, and that nothing else got slower)
Each run starts a fresh receiver (--discard) on 127.0.0.1. Wire version: whatever the binary speaks.
"""
import argparse
import json
import os
import pathlib
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "integration"))
import dgram_wire as w  # noqa: E402
from procstat import cpu_seconds as cpu_s, pte_mb, rss_mb  # noqa: E402


class Receiver:
    def __init__(self, binary, *args):
        self.err, self.out = tempfile.TemporaryFile(), tempfile.NamedTemporaryFile()
        self.p = subprocess.Popen([binary, "recv", "--transport", "udp", "--listen", "127.0.0.1:0", "--discard",
                                   *map(str, args)], stdout=self.out, stderr=self.err)
        line = ""
        while not line.endswith("\n"):  # (stdout goes to a file: a pipe nobody reads would stall it)
            time.sleep(0.05)
            line = pathlib.Path(self.out.name).read_text()
        self.port = int(line.split("\n")[0].split()[-1].rsplit(":", 1)[1])
        self.addr = f"127.0.0.1:{self.port}"
        self.version = w.probe_version(self.addr)
        time.sleep(0.3)

    def sock(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.connect(("127.0.0.1", self.port))
        return s

    def stderr_lines(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace").count("\n")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(60)  # (a receiver from before issue 19 took over 10 s to free ten huge sessions)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)


def drain(s, wait):
    n, total = 0, 0
    s.settimeout(wait)
    try:
        while True:
            total += len(s.recv(65536))
            n += 1
    except (socket.timeout, ConnectionRefusedError):
        pass
    return n, total


def hello_attack(binary):
    rx = Receiver(binary, "--max-memory", "100G")  # each hello accepted: what an accepted one costs
    v, pid = rx.version, rx.p.pid
    r0, c0 = rss_mb(pid), cpu_s(pid)
    s = rx.sock()
    req = w.segment(w.hello(name="big0", ring=256, devices=range(4096), version=v), version=v, qp=100)
    s.send(req)
    _, reply = drain(s, 1.0)
    out = {"request_B": len(req), "reply_B": reply, "rss_one_MB": rss_mb(pid) - r0, "cpu_one_s": cpu_s(pid) - c0}
    for i in range(1, 10):
        s.send(w.segment(w.hello(name=f"big{i}", ring=256, devices=range(4096), version=v), version=v, qp=100 + i))
        drain(s, 0.5)
    out["rss_ten_MB"] = rss_mb(pid) - r0
    out["cpu_ten_s"] = cpu_s(pid) - c0
    rx.stop()
    return out


def select_ready(sock, wait):
    return bool(select.select([sock], [], [], wait)[0])


def partials_attack(binary, *budget):
    rx = Receiver(binary, *budget, "--session-timeout", "5")
    v, pid = rx.version, rx.p.pid
    r0 = rss_mb(pid)
    s = rx.sock()
    s.send(w.segment(w.hello(protocol="dgram_rd", name="rd", ring=19, max_message=1 << 20, devices=range(4096),
                             version=v), version=v, qp=5))
    answer = w.reply_type(s.recv(65536)) if select_ready(s, 1.0) else None
    drain(s, 0.5)
    seq = 0
    for d in range(4096):
        for msn in range(19):
            s.send(w.segment(b"x", version=v, service=w.RD, qp=5, queue=d, msn=msn, offset=(1 << 20) - 1, last=False,
                             rd=(seq, 0, 0, 1, 0)))
            seq += 1
        if d % 64 == 0:
            drain(s, 0.001)
    drain(s, 2.0)
    out = {"answer": answer, "segments": seq, "rss_2s_MB": rss_mb(pid) - r0, "pte_2s_MB": pte_mb(pid)}
    for _ in range(8):  # the session stays alive (an RD probe a second); its partial messages do not
        s.send(w.segment(version=v, service=w.RD, opcode=w.ACK, qp=5, rd=(0, 0, 0, 4, 0)))
        drain(s, 1.0)
    out["rss_after_timeout_MB"] = rss_mb(pid) - r0
    out["pte_after_timeout_MB"] = pte_mb(pid)
    rx.stop()
    return out


def partials_allowed(binary):
    """The budget raised so far that the hello is accepted: what its partial messages then cost."""
    return partials_attack(binary, "--max-memory", "100G")


def sessions_attack(binary):
    rx = Receiver(binary)
    v = rx.version
    s = rx.sock()
    t0 = time.monotonic()
    for i in range(1100):
        s.send(w.segment(w.hello(name=f"flood{i}", version=v), version=v, qp=1000 + i))
    spent = time.monotonic() - t0
    time.sleep(0.5)
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x" * 5000)
        f.flush()
        p = subprocess.run([binary, "send", "--to", rx.addr, "--transport", "udp", "--name", "real",
                            f"--file=0={f.name}"], capture_output=True, text=True, timeout=60)
    rx.stop()
    return {"flood_s": round(spent, 3), "real_sender_exit": p.returncode,
            "real_sender_error": p.stderr.strip()[-80:]}


def garbage_attack(binary):
    rx = Receiver(binary)
    v, pid = rx.version, rx.p.pid
    s = rx.sock()
    bad = w.segment(b"\x01\x00garbage", version=v, qp=9)
    c0, t0 = cpu_s(pid), time.monotonic()
    for i in range(300_000):
        s.send(bad)
        if i % 5000 == 0:
            time.sleep(0.005)
    drain(s, 1.0)
    out = {"seconds": round(time.monotonic() - t0, 2), "cpu_s": cpu_s(pid) - c0, "stderr_lines": rx.stderr_lines()}
    rx.stop()
    return out


def peer_run(binary, token, protocol, size, count):
    extra = []
    if token:
        tf = tempfile.NamedTemporaryFile("w", suffix=".token", delete=False)
        tf.write("measurement token\n")
        tf.close()
        extra = ["--token-file", tf.name]
    rx = subprocess.Popen([binary, "dgram-peer", "recv", "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE,
                          text=True)
    addr = rx.stdout.readline().split()[-1]
    tx = subprocess.run([binary, "dgram-peer", "send", "--to", addr, "--protocol", protocol, "--size", str(size),
                         "--count", str(count), *extra], capture_output=True, text=True, timeout=120)
    got = json.loads(rx.stdout.readline())
    rx.wait(30)
    sent = json.loads(tx.stdout)
    return {"MB_s": sent["bytes"] / 1e6 / sent["seconds"], "send_cpu_s": sent["cpu_seconds"],
            "recv_cpu_s": got["cpu_seconds"], "complete": got["complete"]}


def throughput(binary):
    binary, _, token = binary.partition(":")
    out = {}
    for protocol, size, count in (("write_record", 1 << 20, 400), ("dgram_rd", 64 << 10, 2000)):
        r = peer_run(binary, token == "token", protocol, size, count)
        out.update({f"{protocol}_{k}": v for k, v in r.items()})
    return out


ATTACKS = {"hello": hello_attack, "partials": partials_attack, "partials-allowed": partials_allowed, "sessions": sessions_attack, "garbage": garbage_attack,
           "throughput": throughput}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", choices=list(ATTACKS), action="append")
    a = ap.parse_args()
    results = {}
    for name in a.only or list(ATTACKS):
        for run in range(a.runs):
            for b in a.binaries:  # alternating, so that the machine's load falls on both alike
                if ":" in b and name != "throughput":
                    continue
                r = ATTACKS[name](b)
                results.setdefault(name, {}).setdefault(b, []).append(r)
                print(json.dumps({"attack": name, "binary": b, "run": run, **r}), flush=True)
    for name, per in results.items():
        for b, rows in per.items():
            for k in rows[0]:
                vals = [r[k] for r in rows]
                if all(isinstance(x, (int, float)) for x in vals):
                    print(f"{name:9} {k:22} {b}: min {min(vals):.3g} median {statistics.median(vals):.3g} "
                          f"max {max(vals):.3g}")


if __name__ == "__main__":
    main()
