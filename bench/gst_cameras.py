#!/usr/bin/python3
"""12 cameras through the GStreamer elements: `videotestsrc is-live=true` (640x480 RGB, 25 fps) into slotstreamsink,
one sender-name (one connection), into 12 slotstreamsrc of one receiving process, each into a fakesink.

    flock /work/.bench.lock /usr/bin/python3 bench/gst_cameras.py --runs 3 --seconds 10 --zero-copy off,auto

Per run and transport it measures:
  frames lost    frames the cameras produced minus frames that reached the receiving fakesinks
  latency        the receiving pipeline's clock at each fakesink minus the sender's clock when slotstreamsink took
                 the frame (the timestamp/x-slotstream-sent meta); both pipelines run on the system clock
                 (monotonic) of one host, so the difference is the time through slotstream and slotstreamsrc;
                 p50/p99/max after the first second, and the first second's max apart (the first buffer connects)
  sender CPU     CPU time of the sending gst-launch-1.0 per frame, and the same beside a run of the same
                 cameras into fakesink (what videotestsrc itself costs) alternating with it: the difference is
                 slotstreamsink's share
  receiver CPU   CPU time of a receiving gst-launch-1.0 (12 slotstreamsrc into fakesinks) per frame, over its
                 whole life; and of the Python receiver that measures latency, from its first frame to its last
                 (with its probe: one Python call per frame)
The receiving side runs with each --zero-copy mode of slotstreamsrc, alternating within each run: auto (each frame
is its receive block, lent in place) and off (each frame copied once into a pooled GstBuffer). In the same window, the CLI's
figures for the same cameras: `slotstream send --synthetic` into `slotstream recv --discard` (no copy out). Needs python3-gst-1.0 (setup.sh)
and the plugin in build/gst. Prints a Markdown table and writes the raw runs to --out (commit them before quoting a figure
in docs/benchmarks.md).
"""
import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]
WIDTH, HEIGHT, FPS = 640, 480, 25
WARMUP_NS = 1_000_000_000
CAPS = f"video/x-raw,width={WIDTH},height={HEIGHT},format=RGB,framerate={FPS}/1"


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def receiver(cameras, expected, zero_copy):
    """The receiving process (run by this script): prints its address, then one JSON line at the end."""
    import gi
    gi.require_version("Gst", "1.0")
    from gi.repository import GLib, Gst
    Gst.init(None)
    branches = " ".join(f"slotstreamsrc listen=127.0.0.1:0 sender=cams device={d} zero-copy={zero_copy} ! "
                        f"fakesink name=sink{d} sync=false async=false" for d in range(cameras))
    pipeline = Gst.parse_launch(branches)
    sent_caps = Gst.Caps.from_string("timestamp/x-slotstream-sent")
    state = {"frames": [0] * cameras, "latency_ns": [], "cpu_first": None, "cpu_last": None, "error": None}

    def probe(pad, info, device):
        now = pipeline.get_clock().get_time()
        meta = info.get_buffer().get_reference_timestamp_meta(sent_caps)
        if meta:
            state["latency_ns"].append((now, now - meta.timestamp))
        state["frames"][device] += 1
        if state["cpu_first"] is None:
            state["cpu_first"] = cpu_seconds()
        return Gst.PadProbeReturn.OK

    for d in range(cameras):
        pipeline.get_by_name(f"sink{d}").get_static_pad("sink").add_probe(Gst.PadProbeType.BUFFER, probe, d)
    loop = GLib.MainLoop()

    def on_message(bus, msg):
        if msg.type == Gst.MessageType.ELEMENT and msg.get_structure().get_name() == "slotstream-listening":
            if msg.src.get_name() == "slotstreamsrc0":
                print(msg.get_structure().get_string("address"), flush=True)
        elif msg.type == Gst.MessageType.EOS:
            loop.quit()
        elif msg.type == Gst.MessageType.ERROR:
            state["error"] = str(msg.parse_error()[0])
            loop.quit()

    bus = pipeline.get_bus()
    bus.add_signal_watch()
    bus.connect("message", on_message)
    pipeline.set_state(Gst.State.PLAYING)
    loop.run()
    state["cpu_last"] = cpu_seconds()
    pipeline.set_state(Gst.State.NULL)
    # The first second carries the connection's set-up (the first buffer connects): reported apart.
    start = state["latency_ns"][0][0] if state["latency_ns"] else 0
    lat = sorted(v for t, v in state["latency_ns"] if t - start >= WARMUP_NS)
    warmup = [v for t, v in state["latency_ns"] if t - start < WARMUP_NS]
    frames = sum(state["frames"])
    print(json.dumps({
        "frames": frames, "lost": expected - frames, "error": state["error"],
        "latency_ms": {"p50": lat[len(lat) // 2] / 1e6, "p99": lat[int(len(lat) * 0.99)] / 1e6, "max": lat[-1] / 1e6}
        if lat else None,
        "first_second_max_ms": max(warmup) / 1e6 if warmup else None,
        "cpu_us_per_frame": (state["cpu_last"] - state["cpu_first"]) * 1e6 / max(frames, 1)
        if state["cpu_first"] is not None else None,
    }), flush=True)


def sender_argv(sink, cameras, frames):
    return ["gst-launch-1.0", "-q"] + " ".join(
        f"videotestsrc is-live=true num-buffers={frames} pattern={d % 20} ! {CAPS} ! {sink.format(d=d)}"
        for d in range(cameras)).split()


def run_sender(argv, env):
    """Runs a sending gst-launch-1.0 to its end; (exit code, its CPU seconds, stderr)."""
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)  # stderr is small; read after the exit
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_utime + usage.ru_stime, p.stderr.read()


def plain_receiver_cpu(transport, cameras, frames, env, zero_copy):
    """CPU seconds of a receiving gst-launch-1.0 (12 slotstreamsrc into fakesinks) over a whole sending run; it exits 0
    only once every src had its EOS."""
    argv = ["gst-launch-1.0", "-m"] + " ".join(
        f"slotstreamsrc listen=127.0.0.1:0 sender=cams device={d} zero-copy={zero_copy} ! fakesink sync=false "
        f"async=false"
        for d in range(cameras)).split()
    rx = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
    addr = None
    for line in rx.stdout:
        m = re.search(r"slotstream-listening, address=\(string\)([^,]+),", line)
        if m:
            addr = m.group(1)
            break
    if not addr:
        rx.kill()
        raise SystemExit("the gst-launch receiver did not start")
    sink = f"slotstreamsink to={addr} sender-name=cams device={{d}} transport={transport}"
    # Its -m output is drained to its end: a pipe closed early would kill it (SIGPIPE) as it prints its EOS.
    drain = threading.Thread(target=rx.stdout.read, daemon=True)
    drain.start()
    rc, _, err = run_sender(sender_argv(sink, cameras, frames), env)
    _, status, usage = os.wait4(rx.pid, 0)
    drain.join()
    if rc != 0 or os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"plain receiver run failed: sender {rc} {err}")
    return usage.ru_utime + usage.ru_stime


def one_run(transport, cameras, seconds, env, zero_copy):
    frames = FPS * seconds
    expected = cameras * frames
    rx = subprocess.Popen([sys.executable, __file__, "--receiver", str(cameras), str(expected), zero_copy], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    addr = rx.stdout.readline().strip()
    if not re.fullmatch(r"\S+:\d+", addr):
        rx.kill()
        raise SystemExit(f"receiver did not start: {addr!r} {rx.stderr.read()}")
    sink = f"slotstreamsink to={addr} sender-name=cams device={{d}} transport={transport}"
    rc, tx_cpu, err = run_sender(sender_argv(sink, cameras, frames), env)
    if rc != 0:
        rx.kill()
        raise SystemExit(f"sender failed ({rc}): {err}")
    out, rx_err = rx.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    if result["error"]:
        raise SystemExit(f"receiver failed: {result['error']}\n{rx_err}")
    # The receiving side once more as a plain gst-launch-1.0 (no Python, no probe): its CPU per frame.
    result["receiver_gst_launch_cpu_us_per_frame"] = plain_receiver_cpu(transport, cameras, frames, env,
                                                                        zero_copy) * 1e6 / expected
    # The same cameras into fakesink, right after: what the sending pipeline costs without slotstream.
    rc, base_cpu, err = run_sender(sender_argv("fakesink sync=true", cameras, frames), env)
    if rc != 0:
        raise SystemExit(f"baseline sender failed ({rc}): {err}")
    result.update(transport=transport, zero_copy=zero_copy, sender_cpu_us_per_frame=tx_cpu * 1e6 / expected,
                  baseline_cpu_us_per_frame=base_cpu * 1e6 / expected,
                  sink_cpu_us_per_frame=(tx_cpu - base_cpu) * 1e6 / expected, expected=expected)
    return result


def cli_run(binary, transport, cameras, seconds):
    """The CLI's figures in the same window: `slotstream send --synthetic` (12 cameras, 25 fps, 640x480x3) into
    `slotstream recv --discard`; frames lost and CPU per frame on both sides."""
    rx = subprocess.Popen([binary, "recv", "--listen", "127.0.0.1:0", "--discard", "--exit-after-senders", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = rx.stdout.readline().split()[-1]
    rc, tx_cpu, err = run_sender([binary, "send", "--to", addr, "--name", "cams", "--transport", transport,
                                  "--synthetic", f"0-{cameras - 1}:{FPS}:{WIDTH}x{HEIGHT}x3", "--duration",
                                  str(seconds)], None)
    line = rx.stdout.readline()
    rx.stdout.read()  # to its end (the receiver exits after that sender)
    _, status, usage = os.wait4(rx.pid, 0)
    m = re.search(r"messages=(\d+)", line)
    if rc != 0 or not m:
        raise SystemExit(f"CLI run failed: {rc} {err} {line!r}")
    expected = cameras * FPS * seconds
    return {"transport": transport, "lost": expected - int(m.group(1)), "expected": expected,
            "sender_cpu_us_per_frame": tx_cpu * 1e6 / expected,
            "receiver_cpu_us_per_frame": (usage.ru_utime + usage.ru_stime) * 1e6 / expected}


def summary(values):
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.0f} [{min(values):.0f}–{max(values):.0f}]" if values else "—"


def summary_ms(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--receiver":
        return receiver(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="frames per camera = 25 x seconds")
    ap.add_argument("--cameras", type=int, default=12)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--plugin-path", default=str(REPO / "build" / "gst"))
    ap.add_argument("--bin", default=str(REPO / "build" / "slotstream"), help="the CLI, for its figures beside")
    ap.add_argument("--out", default="/tmp/gst_cameras.json")
    ap.add_argument("--zero-copy", default="auto", help="slotstreamsrc zero-copy modes to alternate (auto,off)")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI's figures")
    args = ap.parse_args()
    env = dict(os.environ, GST_PLUGIN_PATH=args.plugin_path)
    runs = []
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    for i in range(args.runs):
        for transport in args.transports.split(","):
            for mode in args.zero_copy.split(","):
                r = one_run(transport, args.cameras, args.seconds, env, mode)
                r["load_average"] = os.getloadavg()[0]
                print(f"run {i + 1} {transport} zero-copy={mode}: {json.dumps(r)}", file=sys.stderr, flush=True)
                runs.append(r)
            if args.no_cli:
                continue
            c = cli_run(args.bin, transport, args.cameras, args.seconds)
            c["cli"] = True
            print(f"run {i + 1} {transport} CLI: {json.dumps(c)}", file=sys.stderr, flush=True)
            runs.append(c)
    pathlib.Path(args.out).write_text(json.dumps(runs, indent=1))
    print(f"| transport | zero-copy | frames lost | latency p50 ms | p99 ms | max ms | first second max ms | sender CPU µs/frame "
          f"(of which slotstreamsink) | receiver CPU µs/frame (gst-launch; Python with probe) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for transport, mode in [(t, m) for t in args.transports.split(",") for m in args.zero_copy.split(",")]:
        rs = [r for r in runs if r["transport"] == transport and r.get("zero_copy") == mode]
        lost = ", ".join(str(r["lost"]) for r in rs)
        print(f"| {transport} | {mode} | {lost} of {rs[0]['expected']} | "
              f"{summary_ms([r['latency_ms']['p50'] for r in rs])} | {summary_ms([r['latency_ms']['p99'] for r in rs])} | "
              f"{summary_ms([r['latency_ms']['max'] for r in rs])} | {summary_ms([r['first_second_max_ms'] for r in rs])} | "
              f"{summary([r['sender_cpu_us_per_frame'] for r in rs])} ({summary([r['sink_cpu_us_per_frame'] for r in rs])}) | "
              f"{summary([r['receiver_gst_launch_cpu_us_per_frame'] for r in rs])}; "
              f"{summary([r['cpu_us_per_frame'] for r in rs])} |")

    if args.no_cli:
        return
    print()
    print("| transport | CLI: frames lost | sender CPU µs/frame | receiver (`recv --discard`) CPU µs/frame |")
    print("|---|---|---|---|")
    for transport in args.transports.split(","):
        cs = [r for r in runs if r["transport"] == transport and r.get("cli")]
        print(f"| {transport} | {', '.join(str(c['lost']) for c in cs)} of {cs[0]['expected']} | "
              f"{summary([c['sender_cpu_us_per_frame'] for c in cs])} | "
              f"{summary([c['receiver_cpu_us_per_frame'] for c in cs])} |")


if __name__ == "__main__":
    main()
