#!/usr/bin/env python3
"""Receive device streams and compute a checksum of every message: a Python processing worker.

    python3 checksum_receiver.py --listen 0.0.0.0:7000 --senders 1

Prints `listening on HOST:PORT`, then one JSON line per message (sender, device, seq, bytes,
sha256) and, on stderr at the end, one summary line per sender session. Frames are processed where they arrived: the
memoryview is handed to hashlib (or np.frombuffer) without another copy. --senders N ends after
N senders have finished; Ctrl-C ends it too.
"""
import argparse
import hashlib
import json
import sys

import slotstream


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    ap.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp"])
    ap.add_argument("--senders", type=int, help="exit after this many senders have ended")
    a = ap.parse_args()

    with slotstream.Receiver(a.listen, transport=a.transport, exit_after_senders=a.senders) as rx:
        print(f"listening on {rx.address}", flush=True)
        try:
            for sender, device, seq, data in rx:
                print(json.dumps({"sender": sender, "device": device, "seq": seq, "bytes": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest()}), flush=True)
        except KeyboardInterrupt:
            pass
        for s in rx.sessions():
            print(json.dumps({"session": s["sender"], "finished": s["finished"], "messages": s["messages"],
                              "reason": s["reason"]}), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
