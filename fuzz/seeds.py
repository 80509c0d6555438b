#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/ (small, checked in; rerun after a wire change).

Seeds are valid inputs, so that the fuzzers start from the real formats: one encoding of every
control message (wire/control.h), a few block headers (wire/block_header.h), typical protocol
options, and for the delivery script a few fixed pseudo-random event scripts.
"""
import pathlib
import random
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"
VERSION = 2  # wire::kProtocolVersion


def s8(b):
    return bytes([len(b)]) + b


def s16(b):
    return struct.pack("<H", len(b)) + b


def b32(b):
    return struct.pack("<I", len(b)) + b


def hello(protocol=b"status_byte", options=b"", devices=(0, 1, 2), lane=0, lanes=1, transport=0):
    return (b"SLST" + struct.pack("<H", VERSION) + s8(protocol) + s16(options) + struct.pack("<II", 32, 1 << 20) +
            bytes([transport]) + s8(b"host-1234") + s8(b"edge-a") + struct.pack("<H", len(devices)) +
            b"".join(struct.pack("<H", d) for d in devices) + struct.pack("<QHH", 0x1234, lane, lanes) + bytes(range(32)))


def block_header(flags, device, packet, length, capacity):
    w0 = 1 | flags << 8 | device << 16
    check = ~(w0 ^ packet ^ length) & 0xFFFFFFFF
    return struct.pack("<I", capacity) + struct.pack("<BBHIII", 1, flags, device, packet, length, check)


def main():
    seeds = {
        "control": {
            "hello": hello(),
            "hello-lanes": hello(b"sliding_window", b"window=8", devices=(5,), lane=2, lanes=4, transport=2),
            "accept": bytes([1]) + b32(bytes(40)) + b32(bytes(24)) + s8(bytes(32)),
            "accept-no-proof": bytes([2]) + b32(b"addr") + b32(b"") + s8(b""),
            "setup": b32(bytes(16)) + b32(b"") + s8(bytes(32)),
            "refuse": struct.pack("<H", 6) + s16(b"unknown sender"),
            "fin": struct.pack("<H", 2) + struct.pack("<HQ", 0, 40) + struct.pack("<HQ", 1, 41),
            "fin-ack": bytes([1]) + struct.pack("<Q", 81) + s16(b""),
            "pause": struct.pack("<HB", 3, 1),
            "capacity": struct.pack("<IQIQ", 3, 1 << 20, 250, 1 << 30),
            "capacity-request": b"SLST" + struct.pack("<H", VERSION),
        },
        "block_header": {
            "only": block_header(3, 0, 0, 100, 1 << 20),
            "first": block_header(1, 11, 7, 1 << 20, 1 << 20),
            "middle": block_header(0, 65535, 0xFFFFFFFF, 0, 48),
            "last-too-long": block_header(2, 3, 9, 49, 48),
        },
        "options": {
            "empty": b"",
            "budget": b"budget=2M",
            "several": b"ack_every=4,budget=64KiB,notify=on,window=16",
            "spec": b"sliding_window:window=8",
            "bad-trailing-comma": b"window=8,",
            "size-units": b"1T",
        },
    }
    # The control stream: frames (u32 length | type | body) back to back, after one byte that
    # picks the type expect() waits for.
    def frame(t, body):
        return struct.pack("<IB", len(body) + 1, t) + body
    c = seeds["control"]
    seeds["control_frame"] = {
        "hello-then-fin": bytes([1]) + frame(1, c["hello"]) + frame(6, c["fin"]),
        "pause-resume": bytes([6]) + frame(12, c["pause"]) + frame(12, struct.pack("<HB", 3, 0)) + frame(6, c["fin"]),
        "refused": bytes([4]) + frame(5, c["refuse"]),
        "accept-setup-ready": bytes([4]) + frame(4, c["accept"]) + frame(10, c["setup"]) + frame(11, b""),
        "cut-short": bytes([9]) + frame(9, c["capacity"])[:-3],
        "zero-length": bytes([1]) + struct.pack("<I", 0),
    }
    rng = random.Random(13)
    seeds["delivery"] = {f"script-{i}": bytes(rng.randrange(256) for _ in range(n))
                         for i, n in enumerate((16, 64, 128, 256, 512, 1024))}
    for target, files in seeds.items():
        d = ROOT / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)


if __name__ == "__main__":
    main()
