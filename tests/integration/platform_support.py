"""A real etcd cluster for the platform tests (Debian's etcd-server), on loopback ports picked free
at start, and a reader of its state through etcd's own JSON gateway (independent of slotstream's
client): start_cluster(tmp, members) -> EtcdCluster. Protected like a production one, on request:
tls=True serves https only, with certificates of a CA made here by openssl, and asks every client
for a certificate of that CA (EtcdCluster.tls_args: what slotstream is then given);
enable_auth() turns on etcd's own users with a role for slotstream's keys."""
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
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


def _openssl(*args):
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_pki(d):
    """A CA, a certificate for 127.0.0.1 signed by it (the members'; also for clients: etcd's JSON gateway
    connects to the member's own gRPC with it), one for a client, and a second CA that signed none of them:
    {name: path} of ca, server, server_key, client, client_key, other_ca."""
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = d / "ca.pem", d / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", 2,
             "-subj", "/CN=slotstream test CA")
    out = {"ca": ca}
    server_ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    client_ext = "extendedKeyUsage=clientAuth\n"
    for name, cn, ext in (("server", "127.0.0.1", server_ext), ("client", "slotstream", client_ext)):
        key, csr, cert, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem", d / f"{name}.ext"
        extfile.write_text(ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={cn}")
        _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", 2, "-extfile", extfile)
        out[name], out[f"{name}_key"] = cert, key
    other = d / "other-ca.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "other-ca.key", "-out", other,
             "-days", 2, "-subj", "/CN=another CA")
    out["other_ca"] = other
    return out


class EtcdCluster:
    def __init__(self, tmp, members, tls=False, extra=()):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.names = [f"m{i}" for i in range(members)]
        self.procs = [None] * members
        self.logs = [tmp / f"etcd-{n}.log" for n in self.names]
        self.extra = list(extra)
        self.pki = make_pki(tmp / "pki") if tls else None
        self.scheme = "https" if tls else "http"
        self.token = None  # the root user's, once enable_auth() ran
        self._context = None
        if tls:
            self._context = ssl.create_default_context(cafile=str(self.pki["ca"]))
            self._context.load_cert_chain(str(self.pki["client"]), str(self.pki["client_key"]))

    @property
    def tls_args(self):
        """What slotstream needs to reach a tls=True cluster."""
        p = self.pki
        return ["--platform-cacert", p["ca"], "--platform-cert", p["client"], "--platform-key", p["client_key"]]

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
                    "--listen-client-urls", f"{self.scheme}://127.0.0.1:{client}",
                    "--advertise-client-urls", f"{self.scheme}://127.0.0.1:{client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token,
                    # a loaded 2-core machine: heartbeats every 100 ms, elections after 1 s (etcd's defaults)
                    "--heartbeat-interval", "100", "--election-timeout", "1000", *self.extra]
            if self.pki:
                argv += ["--cert-file", str(self.pki["server"]), "--key-file", str(self.pki["server_key"]),
                         "--client-cert-auth", "--trusted-ca-file", str(self.pki["ca"])]
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
            with urllib.request.urlopen(f"{self.scheme}://127.0.0.1:{self.client_ports[i]}/health", timeout=1,
                                        context=self._context) as r:
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

    def _post(self, path, body, token=None):
        last = None
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            headers = {"Authorization": token or self.token} if (token or self.token) else {}
            req = urllib.request.Request(f"{self.scheme}://127.0.0.1:{self.client_ports[i]}{path}",
                                         data=json.dumps(body).encode(), method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=3, context=self._context) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                reply = json.loads(e.read() or b"{}")
                if "invalid auth token" in reply.get("message", "") and self.token and not token:
                    self.token = self._authenticate("root", "root-pw")  # expired (--auth-token-ttl): again
                    return self._post(path, body)
                raise AssertionError(f"etcd answered {path} with HTTP {e.code}: {reply}") from None
            except OSError as e:
                last = e
        raise AssertionError(f"no etcd member answered {path}: {last}")

    def _authenticate(self, user, password):
        self.token = None
        return self._post("/v3/auth/authenticate", {"name": user, "password": password})["token"]

    def enable_auth(self, users):
        """etcd's own authentication on: a root user (kept by this object), and for each (user, password, perms)
        of `users` a user whose role has each (READ or READWRITE, key) of perms — a key ending in '/' as a
        prefix, any other alone (docs/platform.md, "Protecting the platform")."""
        self._post("/v3/auth/user/add", {"name": "root", "password": "root-pw"})
        self._post("/v3/auth/role/add", {"name": "root"})
        self._post("/v3/auth/user/grant", {"user": "root", "role": "root"})
        for user, password, perms in users:
            self._post("/v3/auth/user/add", {"name": user, "password": password})
            self._post("/v3/auth/role/add", {"name": f"{user}-role"})
            for perm, key in perms:
                grant = {"permType": perm, "key": _b64(key)}
                if key.endswith("/"):
                    grant["range_end"] = _b64(_prefix_end(key))
                self._post("/v3/auth/role/grant", {"name": f"{user}-role", "perm": grant})
            self._post("/v3/auth/user/grant", {"user": user, "role": f"{user}-role"})
        self._post("/v3/auth/enable", {})
        self.token = self._authenticate("root", "root-pw")

    def put(self, key, value, lease=0):
        """Writes `value` (a str, or JSON-encoded) as etcd's root would: what an outsider with write access can do."""
        text = value if isinstance(value, str) else json.dumps(value)
        body = {"key": _b64(key), "value": _b64(text)}
        if lease:
            body["lease"] = str(lease)
        self._post("/v3/kv/put", body)

    def grant(self, ttl):
        return int(self._post("/v3/lease/grant", {"TTL": str(ttl)})["ID"])

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


def start_cluster(tmp, members=3, tls=False, extra=()):
    require_etcd()
    return EtcdCluster(tmp, members, tls=tls, extra=extra).start()
