#!/usr/bin/env python3
"""Stream camera frames to a slotstream receiver: the loop a Python camera program runs.

    python3 camera_sender.py --to 127.0.0.1:7000 --cameras 12 --fps 25 --seconds 10
    python3 camera_sender.py --to 127.0.0.1:7000 --video 0=clip.mp4 --video 1=clip2.mp4   # OpenCV

Each camera is a numpy array of HEIGHTxWIDTHx3 bytes (what cv2.VideoCapture.read() returns);
send() reads it in place — no tobytes(), no copy in Python. With --video, frames come from
OpenCV (pip install opencv-python-headless); without, from synthetic frames whose first 8 bytes
carry the frame number. --fps 0 sends as fast as the receiver takes them. Prints one JSON line:
frames, seconds, frames_per_s, mb_per_s, cpu_seconds (this process: the loop and the library's
sending thread).
"""
import argparse
import json
import time

import numpy as np

import slotstream


def synthetic_cameras(n, height, width):
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(n)]


def open_videos(specs):
    import cv2  # optional: only for --video
    captures = {}
    for spec in specs:
        device, _, path = spec.partition("=")
        cap = cv2.VideoCapture(path)
        if not cap.isOpened():
            raise SystemExit(f"cannot open video {path!r}")
        captures[int(device)] = cap
    return captures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--to", required=True, help="receiver HOST:PORT")
    ap.add_argument("--name", default=None, help="sender name (default: the host name)")
    ap.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp"])
    ap.add_argument("--cameras", type=int, default=12)
    ap.add_argument("--size", default="640x480", help="WIDTHxHEIGHT of synthetic frames")
    ap.add_argument("--fps", type=float, default=25.0, help="frames per second per camera (0: as fast as possible)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--frames", type=int, help="frames per camera (instead of --seconds)")
    ap.add_argument("--video", action="append", default=[], help="DEVICE=FILE: frames from a video (OpenCV)")
    a = ap.parse_args()

    width, height = (int(v) for v in a.size.split("x"))
    if a.video:
        captures = open_videos(a.video)
        devices = sorted(captures)
    else:
        frames = synthetic_cameras(a.cameras, height, width)
        devices = list(range(a.cameras))
    total = a.frames if a.frames is not None else None
    sent = 0
    with slotstream.Sender(a.to, name=a.name, transport=a.transport, devices=devices) as tx:
        cpu0, t0 = time.process_time(), time.monotonic()
        k = 0
        while (k < total) if total is not None else (time.monotonic() - t0 < a.seconds):
            if a.fps > 0:  # the cameras' clock: frame k of every camera is due at t0 + k / fps
                delay = t0 + k / a.fps - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            for device in devices:
                if a.video:
                    ok, frame = captures[device].read()
                    if not ok:
                        total = k  # the shortest video ends the stream
                        break
                else:
                    frame = frames[device]
                    frame.reshape(-1)[:8] = np.frombuffer(k.to_bytes(8, "little"), np.uint8)
                tx.send(device, frame)
                sent += 1
            k += 1
        transport = tx.transport
    seconds = time.monotonic() - t0
    frame_bytes = width * height * 3
    print(json.dumps({"frames": sent, "cameras": len(devices), "seconds": round(seconds, 3),
                      "frames_per_s": round(sent / seconds, 1), "mb_per_s": round(sent * frame_bytes / seconds / 1e6, 1),
                      "cpu_seconds": round(time.process_time() - cpu0, 3), "transport": transport}))


if __name__ == "__main__":
    main()
