"""The figures' shared part (bench/plot.py, dgram_plot.py): a protocol's colour and a figure of one line per
protocol. The report's tables and cells, which need no matplotlib, are report_cells.py's."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from report_cells import human, proto_key  # noqa: E402


# One colour per protocol in every figure; the references are dashed/dotted and grey-black.
STYLE = {"status_byte": dict(color="tab:blue", ls="-", marker="o"),
         "sliding_window": dict(color="tab:orange", ls="-", marker="s"),
         "credit": dict(color="tab:red", ls="-", marker="D"),
         "carc": dict(color="tab:brown", ls="-", marker="h"),
         "packed_ring": dict(color="tab:green", ls="-", marker="P"),
         "packed_ring:flush=idle": dict(color="tab:green", ls="--", marker="x"),
         "nic_assisted": dict(color="tab:purple", ls="-", marker="*"),
         "buffered_read": dict(color="tab:olive", ls="-", marker="d"),
         "ucx_raw_put": dict(color="black", ls="--", marker="^"),
         "tcp_socket": dict(color="tab:gray", ls=":", marker="v"),
         "ucx_perftest_put_bw": dict(color="black", ls=":", marker="1"),
         "status_byte:pack=off": dict(color="tab:cyan", ls="--", marker="o")}


def style(protocol):
    return STYLE.get(protocol, dict(ls="-", marker="."))


def size_ticks(ax, xs):
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels([human(x).replace(" ", "") for x in ticks], rotation=45, fontsize=7)
    ax.minorticks_off()


def legend_outside(ax, fontsize=8):
    """The panel's legend right of it, never over the data (inside, "best" still covered lines and points of
    the busier figures); the figure is saved with bbox_inches="tight" so that it is not cut off."""
    return ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def line_plot(path, title, data, xlabel, ylabel, logx=True, logy=True, sizes=True):
    """One panel per transport (their scales differ by orders of magnitude), one line per protocol."""
    if not data:
        return None
    transports = sorted({t for _, t in data})
    fig, axes = plt.subplots(1, len(transports), figsize=(5.2 * len(transports), 4.2), squeeze=False)
    for ax, t in zip(axes[0], transports):
        xs_all = []
        for p in sorted({p for p, tt in data if tt == t}, key=proto_key):
            xs, ys = zip(*data[(p, t)])
            xs_all += xs
            ax.plot(xs, ys, label=p, markersize=4, **style(p))
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        if sizes:
            size_ticks(ax, xs_all)
        elif logx:
            ax.set_xticks(sorted(set(xs_all)))
            ax.set_xticklabels([str(x) for x in sorted(set(xs_all))])
            ax.minorticks_off()
        ax.set_title(t, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        legend_outside(ax)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


