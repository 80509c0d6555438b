"""Kills slotstream processes at several points of their set-up and reports what they left in /dev/shm (JSON on
stdout). Run by test_shm_cleanup.py inside a private mount namespace with a /dev/shm of its own, so that only these
processes' segments are there:  python3 shm_kill_points.py BIN

UCX_ALLOC_PRIO=md:posix makes UCX put the 256 MiB regions into POSIX segments (as it does when SysV shared memory
fails), whose creation writes the whole length before the file is unlinked: the widest window there is."""
import json
import os
import subprocess
import sys
import time

BIN = sys.argv[1]
POSIX = dict(os.environ, UCX_ALLOC_PRIO="md:posix")
BIG = 32 << 20


def leftovers():
    """Every POSIX segment file and slotstream directory under /dev/shm: [(path, bytes)]."""
    out = []
    for root, dirs, files in os.walk("/dev/shm"):
        out += [(os.path.join(root, d), 0) for d in dirs if d.startswith("slotstream-")]
        for f in files:
            p = os.path.join(root, f)
            try:
                out.append((p, os.stat(p).st_size))
            except FileNotFoundError:
                pass
    return out


def segments():
    return [(p, n) for p, n in leftovers() if os.path.basename(p).startswith("ucx_shm_posix_")]


def receiver(env=None):
    rx = subprocess.Popen([BIN, "recv", "--listen", "127.0.0.1:0", "--discard", "--transport", "shm"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    return rx, rx.stdout.readline().split()[2]


def sender(addr, name, env=None, blocks=64):
    return subprocess.Popen([BIN, "send", "--to", addr, "--name", name, "--transport", "shm", "--blocks", str(blocks),
                             "--block-size", str(4 << 20), "--synthetic", "0-1:25:64x64x1", "--duration", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def kill_when(proc, condition, timeout=20):
    """SIGKILLs proc as soon as condition() holds (polled continuously); whether it held before proc ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            proc.kill()
            proc.wait()
            return True
    proc.kill()
    proc.wait()
    return False


def main():
    report = {"kills": {}, "sessions": 0}
    rx, addr = receiver()
    points = {
        # the sender's first segment exists: a UCX worker's receive FIFO, at context creation
        "sender: first segment": lambda: bool(segments()),
        # its 256 MiB send ring is being written into /dev/shm
        "sender: ring being written": lambda: any(n >= BIG for _, n in segments()),
    }
    for what, condition in points.items():
        hits = 0
        for i in range(3):
            hits += kill_when(sender(addr, f"s{len(report['kills'])}{i}", POSIX), condition)
        report["kills"][what] = hits
    # Whenever: uniformly within the first 300 ms (handshake, set-up, first frames).
    for i in range(4):
        tx = sender(addr, f"r{i}", POSIX)
        time.sleep(0.075 * i)
        tx.kill()
        tx.wait()
    report["kills"]["sender: at 0-225 ms"] = 4
    # A whole session still works with the segments where they now are.
    ok = subprocess.run([BIN, "send", "--to", addr, "--name", "fine", "--transport", "shm", "--synthetic",
                         "0:25:64x64x1", "--duration", "0.3"], capture_output=True, timeout=60)
    report["sessions"] += ok.returncode == 0
    rx.kill()
    rx.wait()
    # The receiver itself, killed while it writes a 256 MiB region for a sender.
    hits = 0
    for i in range(2):
        rx, addr = receiver(POSIX)
        tx = sender(addr, f"v{i}")
        hits += kill_when(rx, lambda: any(n >= BIG for _, n in segments()))
        tx.kill()
        tx.wait()
    report["kills"]["receiver: region being written"] = hits
    deadline = time.monotonic() + 5  # the processes that clean up after the killed ones run by themselves
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    report["left"] = leftovers()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
