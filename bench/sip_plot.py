"""Figure and report section of `slotstream bench sipscale` (bench/sip_experiments.py), drawn from results.json;
bench/dgram_plot.py calls them (helpers: plot_common's and report_cells')."""
from plot_common import plt
from report_cells import per_run, pick, spread_text

PATENT = ("\"SIPp was configured to generate a load emulating many clients, which creates a single UDP port for each "
          "client. We find that at 10000 clients, we have a memory savings of 24.1 %\" (UD against RC; memory = SIPp's "
          "application memory plus the slab space allocated for the sockets; theory 28.1 %)")
TRANSPORTS = ["udp+shim", "udp", "tcp"]
PARTS = [("rss_uac_kib", "uac RSS", "tab:blue"), ("rss_uas_kib", "uas RSS", "tab:cyan"),
         ("slab_kib", "socket slab", "tab:orange")]


def _clients(records):
    return sorted({r["size_bytes"] for r in records if r["experiment"] == "sipscale"})


def figure(records, out):
    clients = _clients(records)
    if not clients:
        return None
    n = clients[-1]
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(TRANSPORTS)
    for metric, label, color in PARTS:
        vals = pick(records, "sipscale", metric)
        ys = [vals.get(("sipp", t, 1, n), 0) / 1024 for t in TRANSPORTS]
        ax.bar(TRANSPORTS, ys, bottom=bottom, label=label, color=color)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_ylabel("MiB at the plateau")
    ax.set_title(f"SIPp, {n:,} clients with a socket each (patent: UDP 24.1 % below TCP)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(out / "fig_sip_memory.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "fig_sip_memory.png"


ROWS = [("calls_open", "calls open at the plateau", "{:.0f}", 1), ("ramp_seconds", "ramp, s", "{:.1f}", 1),
        ("rss_uac_kib", "uac RSS, MiB", "{:.1f}", 1024), ("rss_uas_kib", "uas RSS, MiB", "{:.1f}", 1024),
        ("slab_kib", "socket slab delta, MiB (summed caches)", "{:.1f}", 1024),
        ("memory_kib", "**memory, MiB** (RSS + slab)", "{:.1f}", 1024),
        ("memory_per_client_kib", "memory per client, KiB", "{:.2f}", 1),
        ("memory_saving_vs_tcp", "**saving vs TCP**", "{:.1%}", 1),
        ("sockstat_mem_kib", "sockstat mem delta, MiB (TCP + UDP pages charged, system-wide)", "{:.1f}", 1024),
        ("slab_dentry_kib", "dentry delta, MiB (not summed)", "{:.1f}", 1024),
        ("calls_failed", "calls failed", "{:.0f}", 1), ("calls_successful", "calls successful", "{:.0f}", 1),
        ("sip_response_p50", "INVITE -> 200 OK p50, ms (every call)", "{:.0f}", 1),
        ("sip_response_p99", "INVITE -> 200 OK p99, ms", "{:.0f}", 1),
        ("sip_response_p50_last_tenth", "p50, ms, last tenth of the calls", "{:.0f}", 1),
        ("sip_response_p99_last_tenth", "p99, ms, last tenth of the calls", "{:.0f}", 1)]


def report_section(records):
    clients = _clients(records)
    if not clients:
        return []
    md = ["### SIPp with a socket per client: memory and response time (issue 25)\n", f"Patent: {PATENT}.\n\n",
          "`sipp -sn uac -t un` (a UDP socket per call) against `sipp -sn uas -t u1`, through libslotstream_udp.so on "
          "both ends or plain; TCP: `-t tn` (a connection per call) against `-t t1`. The client opens the calls at a "
          "bounded rate and holds them; at the plateau: both processes' VmRSS and the change in /proc/slabinfo's "
          "socket caches since before the point (active objects x object size: UDP, UDPv6, TCP, TCPv6, "
          "request_sock_TCP, sock_inode_cache, filp, eventpoll_epi, eventpoll_pwq, tcp_bind_bucket, "
          "skbuff_head_cache, skbuff_small_head; dentry is shown, not summed: the cache is shared with every "
          "build on the machine). Response time from sipp's -trace_rtt (1 ms resolution).\n\n"]
    for n in clients:
        md += [f"{n:,} clients:\n\n", "| | " + " | ".join(TRANSPORTS) + " |", "|---" * (len(TRANSPORTS) + 1) + "|"]
        for metric, label, fmt, scale in ROWS:
            vals = per_run(records, "sipscale", metric)
            cells = [spread_text([v / scale for v in vals[("sipp", t, 1, n)]], fmt) if ("sipp", t, 1, n) in vals
                     else "–" for t in TRANSPORTS]
            if any(c != "–" for c in cells):
                md.append(f"| {label} | " + " | ".join(cells) + " |")
        md.append("")
    return md
