"""Helpers for the datagram transport's integration tests (test_dgram_*.py).

  netns(tag)                       a fresh network namespace with lo up; deleted afterwards, even on failure
  netns_pair(tag)                  two namespaces joined by a veth pair: (ns_a, addr_a, ns_b, addr_b)
  netns_bridge(tag, n)              n + 1 namespaces on one bridge (multicast flooded): [(ns, addr, dev), ...]
  nft_loss(ns, percent)            drops that share of UDP and TCP packets arriving in ns (nftables, input hook)
  in_ns(ns, argv)                  argv run inside ns
  DgramReceiver(out, *args, ns=, prefix=)  `slotstream recv --transport udp`, started and ready (prefix: e.g. prlimit)
  dgram_send(addr, *args, ns=)     `slotstream send ... --json` to completion -> (CompletedProcess, json)
  check_store(dev_dir, sources)    every stored message is byte-exact or, partial, exact where valid
Names are unique per process and call, so parallel runs never collide; namespaces need root.
"""
import contextlib
import itertools
import json
import os
import pathlib
import re
import subprocess

import pytest

from conftest import BIN, Proc

_counter = itertools.count()
SHIM = pathlib.Path(BIN).resolve().parent / "libslotstream_udp.so"


def _unique(tag):
    return f"ss{tag}{os.getpid() % 100000}x{next(_counter)}"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@contextlib.contextmanager
def netns(tag="n", mtu=None):
    """A namespace with lo up. With `mtu`, lo carries Ethernet-sized packets and no segmentation offload: TCP
    then sends one packet per MSS instead of a few 64 KiB ones, so a loss rule sees what a wire would."""
    name = _unique(tag)
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        pytest.skip(f"cannot create a network namespace (needs root and iproute2): {r.stderr.strip()}")
    try:
        extra = ["mtu", str(mtu), "gso_max_size", str(mtu), "gso_max_segs", "1"] if mtu else []
        _ip("-n", name, "link", "set", "lo", "up", *extra)
        yield name
    finally:
        subprocess.run(["ip", "netns", "pids", name], capture_output=True)
        for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


@contextlib.contextmanager
def netns_pair(tag="p"):
    """Two namespaces joined by a veth pair (MTU 1500, like Ethernet): 10.77.0.1 and 10.77.0.2."""
    with netns(tag + "a") as a, netns(tag + "b") as b:
        va, vb = _unique("va")[:15], _unique("vb")[:15]
        _ip("link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b)
        _ip("-n", a, "addr", "add", "10.77.0.1/24", "dev", va)
        _ip("-n", b, "addr", "add", "10.77.0.2/24", "dev", vb)
        _ip("-n", a, "link", "set", va, "up")
        _ip("-n", b, "link", "set", vb, "up")
        yield a, "10.77.0.1", b, "10.77.0.2"


@contextlib.contextmanager
def netns_bridge(tag="m", n=3):
    """n + 1 namespaces, each with a veth (MTU 1500) on one bridge in a hub namespace of its own, addresses
    10.78.0.1 ... and a route for multicast (224.0.0.0/4) on the veth; the bridge floods multicast to every
    port (no IGMP snooping). Each veth cuts GSO packets into MTU-sized ones before they leave (gso_max_segs 1), as
    an Ethernet NIC puts packets on the wire: otherwise the kernel carries a UDP GSO message (the shim's large
    datagrams) whole across veth and bridge to the receiving socket, and a loss rule would drop all of its segments
    at once. Yields [(ns, addr, dev), ...]: the first for a sender, the others receivers."""
    with contextlib.ExitStack() as stack:
        hub = stack.enter_context(netns(tag + "h"))
        _ip("-n", hub, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", hub, "link", "set", "br0", "up")
        ends = []
        for i in range(n + 1):
            ns = stack.enter_context(netns(f"{tag}{i}"))
            dev, port = _unique("vm")[:15], _unique("vp")[:15]
            _ip("link", "add", dev, "netns", ns, "type", "veth", "peer", "name", port, "netns", hub)
            _ip("-n", hub, "link", "set", port, "master", "br0", "up")
            addr = f"10.78.0.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up", "gso_max_segs", "1")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
            ends.append((ns, addr, dev))
        yield ends


def nft_loss(ns, percent):
    """Real loss: drop `percent` % of the UDP and TCP packets arriving in ns (input hook, so the sender's
    socket sees no error, as with loss on a wire). `numgen random mod 100000` gives 0.001 % steps."""
    threshold = int(round(percent * 1000))
    rules = ("table inet slotstream_loss {\n"
             "  chain input { type filter hook input priority 0; policy accept;\n"
             f"    meta l4proto {{ udp, tcp }} numgen random mod 100000 < {threshold} counter drop\n"
             "  }\n}\n")
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True,
                       timeout=20)
    if r.returncode != 0:
        pytest.skip(f"nftables unavailable: {r.stderr.strip()}")


def nft_dropped(ns):
    """Packets the loss rule dropped so far."""
    out = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "slotstream_loss"],
                         capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"counter packets (\d+)", out)
    return int(m.group(1)) if m else 0


def in_ns(ns, argv):
    return ["ip", "netns", "exec", ns, *[str(a) for a in argv]] if ns else [str(a) for a in argv]


class DgramReceiver(Proc):
    """`slotstream recv --transport udp --listen HOST:0 --out OUT ARGS`, ready (its `listening on` line read)."""

    def __init__(self, out, *args, ns=None, host="127.0.0.1", prefix=(), port=0):
        argv = [*prefix, BIN, "recv", "--transport", "udp", "--listen", f"{host}:{port}"]
        argv += ["--out", str(out)] if out else ["--discard"]
        super().__init__(in_ns(ns, argv + [str(a) for a in args]))
        _, line = self.stdout.wait_for(r"^listening on ", 10)
        self.stdout.cursor = 1
        self.addr = line.split()[-1]
        self.port = int(self.addr.rsplit(":", 1)[1])

    def finished(self, n=1, timeout=30):
        """The next n `sender NAME finished:`/`lost:` lines as dicts of their key=value fields."""
        out = []
        for _ in range(n):
            line = self.stdout.next_line(timeout)
            assert line, f"no session report within {timeout} s; stderr:\n{self.stderr.text}"
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            fields["line"] = line
            out.append(fields)
        return out

    def stop(self):
        return self.terminate(10)


def dgram_send(addr, *args, ns=None, timeout=60, check=True, transport="udp"):
    argv = in_ns(ns, [BIN, "send", "--to", addr, "--transport", transport, "--json", *[str(a) for a in args]])
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"send did not finish within {timeout} s: {' '.join(argv)}\n{e.stderr!r}") from None
    if check:
        assert p.returncode == 0, f"send failed ({p.returncode}): {' '.join(argv)}\n{p.stderr}"
    j = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None
    return p, j


def accounted(j):
    """Asserts every message the sender sent is exactly one of complete, partial, dropped, lost; returns totals."""
    r = j["receiver"]
    for dev, d in r["devices"].items():
        assert d["complete"] + d["partial"] + d["dropped"] + d["lost"] == d["sent"], (dev, d)
    assert sum(d["sent"] for d in r["devices"].values()) == j["messages"]
    return r


def check_store(dev_dir, sources):
    """Every file in dev_dir belongs to message SEQ and is byte-exact (.bin) or exact within its valid ranges
    with zeros elsewhere (.partial + .valid). Returns (complete SEQs, partial SEQs)."""
    dev_dir = pathlib.Path(dev_dir)
    complete, partial = [], []
    names = sorted(os.listdir(dev_dir)) if dev_dir.exists() else []
    assert not [n for n in names if n.startswith(".")], f"temporary files left in {dev_dir}: {names}"
    for name in names:
        seq, ext = name.split(".")
        seq = int(seq)
        assert seq < len(sources), f"{name}: no such message"
        src = pathlib.Path(sources[seq]).read_bytes()
        data = (dev_dir / name).read_bytes()
        if ext == "bin":
            assert data == src, f"{dev_dir / name} differs from its source {sources[seq]}"
            complete.append(seq)
        elif ext == "partial":
            ranges = json.loads((dev_dir / f"{seq:010d}.valid").read_text())
            assert ranges, f"{name}: a partial message with nothing valid"
            assert len(data) <= len(src)
            valid = bytearray(len(data))
            last = -1
            for off, length in ranges:
                assert off > last and length > 0 and off + length <= len(data), (name, ranges)
                assert data[off:off + length] == src[off:off + length], f"{name}: bytes {off}+{length} differ"
                valid[off:off + length] = b"\1" * length
                last = off + length
            assert all(b == 0 for b, v in zip(data, valid) if not v), f"{name}: a hole is not zero-filled"
            assert len(data) == ranges[-1][0] + ranges[-1][1] or len(data) == len(src), name
            partial.append(seq)
        else:
            assert ext == "valid" and (dev_dir / f"{seq:010d}.partial").exists(), f"unexpected file {name}"
    return complete, partial
