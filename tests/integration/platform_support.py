"""A real etcd cluster for the platform tests (Debian's etcd-server), on loopback ports picked free
at start, and a reader of its state through etcd's own JSON gateway (independent of slotstream's
client): start_cluster(tmp, members) -> EtcdCluster."""
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest


def _free_ports(n):
    """n distinct free loopback ports (bound to port 0, then released just before etcd binds them)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _b64(s):
    return base64.b64encode(s.encode()).decode()


def _prefix_end(prefix):
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class EtcdCluster:
    def __init__(self, tmp, members):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.names = [f"m{i}" for i in range(members)]
        self.procs = [None] * members
        self.logs = [tmp / f"etcd-{n}.log" for n in self.names]

    @property
    def url(self):
        return "etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def member_url(self, i):
        return f"etcd://127.0.0.1:{self.client_ports[i]}"

    def start(self):
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        token = uuid.uuid4().hex
        for i, name in enumerate(self.names):
            client, peer = self.client_ports[i], self.peer_ports[i]
            argv = ["etcd", "--name", name, "--data-dir", str(self.tmp / f"etcd-{name}"),
                    "--listen-client-urls", f"http://127.0.0.1:{client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token,
                    # a loaded 2-core machine: heartbeats every 100 ms, elections after 1 s (etcd's defaults)
                    "--heartbeat-interval", "100", "--election-timeout", "1000"]
            self.procs[i] = subprocess.Popen(argv, stdout=open(self.logs[i], "w"), stderr=subprocess.STDOUT,
                                             start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(self._healthy(i) for i in range(len(self.names))):
                return self
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise AssertionError(f"etcd {self.names[i]} exited: {self.logs[i].read_text()[-2000:]}")
            time.sleep(0.1)
        raise AssertionError("etcd cluster did not become healthy in 30 s")

    def _healthy(self, i):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_ports[i]}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except OSError:
            return False

    def kill(self, i):
        p = self.procs[i]
        if p and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self):
        for i in range(len(self.procs)):
            self.kill(i)

    def _post(self, path, body):
        last = None
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            req = urllib.request.Request(f"http://127.0.0.1:{self.client_ports[i]}{path}",
                                         data=json.dumps(body).encode(), method="POST")
            try:
                with urllib.request.urlopen(req, timeout=3) as r:
                    return json.loads(r.read())
            except OSError as e:
                last = e
        raise AssertionError(f"no etcd member answered {path}: {last}")

    def range(self, prefix):
        """{key: (value parsed as JSON, lease)} of every key starting with prefix."""
        j = self._post("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        out = {}
        for kv in j.get("kvs", []):
            key = base64.b64decode(kv["key"]).decode()
            out[key] = (json.loads(base64.b64decode(kv.get("value", "")) or b"null"), int(kv.get("lease", 0)))
        return out

    def receivers(self):
        return {k.rsplit("/", 1)[1]: v for k, (v, _) in self.range("/slotstream/v1/receivers/").items()}

    def reservations(self):
        return [v for v, _ in self.range("/slotstream/v1/reservations/").values()]


def require_etcd():
    """etcd comes with scripts/setup.sh (etcd-server); only a machine without it skips, never CI."""
    if shutil.which("etcd") is None:
        if os.environ.get("CI"):
            raise AssertionError("etcd is not installed (scripts/setup.sh installs etcd-server)")
        pytest.skip("etcd is not installed (apt-get install etcd-server, as scripts/setup.sh does)")


def start_cluster(tmp, members=3):
    require_etcd()
    return EtcdCluster(tmp, members).start()
