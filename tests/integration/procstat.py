"""A process's resident memory, page tables and CPU time from /proc (Linux), for tests and measurements."""
import os


def _status(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid):
    return _status(pid, "VmRSS")


def pte_mb(pid):
    return _status(pid, "VmPTE")


def cpu_seconds(pid):
    """User + system CPU seconds the process has used."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
