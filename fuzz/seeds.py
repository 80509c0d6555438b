#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/ (small, checked in; rerun after a wire change), or under the
directory given as its argument. fuzz/corpus holds these seeds and nothing else (tests/integration/test_fuzz_seeds.py):
what a fuzz run finds goes to build-fuzz/corpus/ (fuzz/run.sh).

Seeds are valid inputs, so that the fuzzers start from the real formats: one encoding of every
control message (wire/control.h), a few block headers (wire/block_header.h), typical protocol
options, for the delivery script a few fixed pseudo-random event scripts, one valid datagram
segment of every shape src/engine/dgram/wire/wire.h defines (control payloads too), each with its CRC32C, and
the GStreamer plugin's messages (gst/frame.h).
"""
import hashlib
import hmac
import pathlib
import random
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"
VERSION = 8  # wire::kProtocolVersion
FUZZ_KEY = bytes([0x5A]) * 32  # control_frame_fuzz.cc's session key


def s8(b):
    return bytes([len(b)]) + b


def s16(b):
    return struct.pack("<H", len(b)) + b


def b32(b):
    return struct.pack("<I", len(b)) + b


def hello(protocol=b"status_byte", options=b"", devices=(0, 1, 2), lane=0, lanes=1, transport=0, rdma=0, offers=1,
          first=None):
    flags = (1 | 2) if first is not None else 0  # numbered and confirm, with one first number per device
    numbers = b"".join(struct.pack("<Q", f) for f in first) if first is not None else b""
    return (b"SLST" + struct.pack("<H", VERSION) + s8(protocol) + s16(options) + struct.pack("<II", 32, 1 << 20) +
            bytes([transport, rdma, offers]) + s8(b"host-1234") + s8(b"ipc=4026531839,uid=0") + s8(b"edge-a") +
            struct.pack("<H", len(devices)) + b"".join(struct.pack("<H", d) for d in devices) +
            struct.pack("<QHHB", 0x1234, lane, lanes, flags) + numbers + bytes(range(32)))


def accept(transport, rdma, offers, reason, address, setup, proof):
    return bytes([transport, rdma, offers]) + s16(reason) + b32(address) + b32(setup) + s8(proof)


def record_header(flags, device, packet, length):
    w0 = 1 | flags << 8 | device << 16
    check = ~(w0 ^ packet ^ length) & 0xFFFFFFFF
    return struct.pack("<BBHIII", 1, flags, device, packet, length, check)


def block_header(flags, device, packet, length, capacity):
    return struct.pack("<I", capacity) + record_header(flags, device, packet, length)


def packed_unit(records, capacity):
    """A packed unit (wire/block_header.h, version 2): header, then records padded to 8 bytes."""
    body = b""
    for flags, device, packet, payload in records:
        r = record_header(flags, device, packet, len(payload)) + payload
        body += r + b"\0" * (-len(r) % 8)
    length = 16 + len(body)
    check = ~(2 ^ len(records) ^ length) & 0xFFFFFFFF
    return struct.pack("<I", capacity) + struct.pack("<BBHIII", 2, 0, 0, len(records), length, check) + body


CRC32C_POLY = 0x82F63B78  # reflected


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (CRC32C_POLY if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def segment(service, opcode, ddp_flags, extra, payload, rd=None, mac=False):
    """A datagram segment (src/engine/dgram/wire/wire.h, version 2): common header, RD header, opcode fields,
    payload, [a 16-byte MAC, here a fixed one: only its place matters to the decoder], CRC32C."""
    flags = ddp_flags | 1 | (0x10 if mac else 0)
    common = b"SD" + bytes([2, flags, 0x40 | opcode, service]) + struct.pack("<HI", len(payload), 0x1234)
    rdb = struct.pack("<IIIIQ", *rd) if rd else b""
    body = common + rdb + extra + payload + (bytes(range(16)) if mac else b"")
    return body + struct.pack("<I", crc32c(body))


def dgram_hello(auth=False, devices=(0, 1)):
    """A HELLO payload (src/engine/dgram/wire/control.h, wire version 2), padded to 256 bytes."""
    body = bytes([1, 1 if auth else 0, 12]) + b"write_record" + bytes([3]) + b"cam" + \
        struct.pack("<IQIH", 4, 1 << 20, 8192, len(devices)) + b"".join(struct.pack("<H", d) for d in devices) + \
        bytes(range(32))
    pad = 256 - len(body) - 2
    return body + struct.pack("<H", pad) + bytes(pad)


def dgram_seeds():
    T, L, M = 0x80, 0x40, 0x20  # tagged, last, marker (DDP flags)
    fin = bytes([4]) + struct.pack("<HHH", 1, 0, 1) + struct.pack("<HQQ", 0, 10, 10000) + struct.pack("<H", 24) + \
        bytes(24)
    fin_ack = bytes([5]) + struct.pack("<HHH", 1, 0, 1) + struct.pack("<HQQQQQ", 0, 9, 0, 1, 0, 90000)
    accept = bytes([2]) + struct.pack("<IIQIHB", 7, 512, 1 << 20, 1, 2, 32) + bytes(range(32))
    auth = bytes([7]) + bytes(32) + struct.pack("<H", 256) + dgram_hello(auth=True) + bytes(32)
    ctl = struct.pack("<III", 0xFFFFFFFF, 0, 0)
    return {
        "write_record_last": segment(0, 8, T | L | M, struct.pack("<IQI", 5, 8192, 7), b"\x11" * 100),
        "write_record_middle": segment(0, 8, T | M, struct.pack("<IQI", 5, 0, 7), b"\x22" * 64),
        "write_record_signed": segment(0, 8, T | L | M, struct.pack("<IQI", 5, 0, 7), b"\x44" * 40, mac=True),
        "rdma_write_rc": segment(2, 0, T, struct.pack("<IQ", 9, 4096), b"\x33" * 32),
        "send_ud": segment(0, 3, L, struct.pack("<III", 2, 3, 0), b"hello"),
        "send_rd": segment(1, 3, L, struct.pack("<III", 0, 0, 0), b"rd", rd=(7, 0, 0, 1, 0)),
        "ack_rd": segment(1, 15, L, b"", b"", rd=(0, 8, 512, 2, 0b101)),
        "ack_rd_signed": segment(1, 15, L, b"", b"", rd=(0, 8, 512, 2, 0), mac=True),
        "control_hello": segment(0, 3, L, ctl, dgram_hello()),
        "control_challenge": segment(0, 3, L, ctl, bytes([6]) + bytes(range(32))),
        "control_auth": segment(0, 3, L, ctl, auth),
        "control_accept": segment(0, 3, L, ctl, accept),
        "control_fin": segment(0, 3, L, struct.pack("<III", 0xFFFFFFFF, 1, 0), fin, mac=True),
        "control_fin_ack": segment(0, 3, L, ctl, fin_ack),
        "shim_send": segment(0, 3, L, struct.pack("<III", 0, 42, 0), b"\x47" + b"\x00" * 187),
    }


def main(root=ROOT):
    seeds = {
        "control": {
            "hello": hello(),
            "hello-numbered": hello(first=(100, 0, 7)),
            "hello-lanes": hello(b"sliding_window", b"window=8", devices=(5,), lane=2, lanes=4, transport=2),
            "hello-rdma": hello(transport=3, rdma=2, offers=3),
            "accept": accept(1, 0, 1, b"sender and receiver share this host", bytes(40), bytes(24), bytes(32)),
            "accept-no-proof": accept(2, 0, 0, b"", b"addr", b"", b""),
            "accept-rdma": accept(3, 1, 3, b"both ends have a usable RDMA device", bytes(40), bytes(24), b""),
            "setup": b32(bytes(16)) + b32(b"") + s8(bytes(32)),
            "refuse": struct.pack("<H", 6) + s16(b"unknown sender"),
            "fin": struct.pack("<H", 2) + struct.pack("<HQ", 0, 40) + struct.pack("<HQ", 1, 41),
            "fin-ack": bytes([1]) + struct.pack("<Q", 81) + s16(b""),
            "pause": struct.pack("<HB", 3, 1),
            "stored": struct.pack("<H", 2) + struct.pack("<HQQ", 0, 40, 3) + struct.pack("<HQQ", 7, 0, 1),
            "number": struct.pack("<HQ", 3, 250),
            "numbered": struct.pack("<HQB", 3, 250, 0) + s16(b"behind the next one"),
            "capacity": struct.pack("<IQIQ", 3, 1 << 20, 250, 1 << 30),
            "capacity-request": b"SLST" + struct.pack("<H", VERSION),
            "keepalive": b"",
        },
        "block_header": {
            "only": block_header(3, 0, 0, 100, 1 << 20),
            "first": block_header(1, 11, 7, 1 << 20, 1 << 20),
            "middle": block_header(0, 65535, 0xFFFFFFFF, 0, 48),
            "last-too-long": block_header(2, 3, 9, 49, 48),
            "packed-three": packed_unit([(3, 0, 0, b"abc"), (4, 9, 0, b"void...."), (3, 1, 5, b"")], 1 << 16),
            "packed-fragment": packed_unit([(1, 2, 7, b"x" * 20), (3, 0, 1, b"y")], 4096),
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
    def signed(t, body, seq):  # a frame from the sender's end of an authenticated connection
        msg = b"slotstream-auth-v2" + s8(b"frame s>r")
        for part in (bytes([t]), struct.pack("<Q", seq), body):
            msg += b32(part)
        return frame(t, body + struct.pack("<Q", seq) + hmac.new(FUZZ_KEY, msg, hashlib.sha256).digest())
    c = seeds["control"]
    seeds["control_frame"] = {
        "signed-fin-then-unsigned": bytes([0x80 | 6]) + signed(6, c["fin"], 0) + frame(6, c["fin"]),
        "signed-pauses-replayed": bytes([0x80 | 12]) + signed(12, c["pause"], 0) + signed(12, c["pause"], 1) +
                                  signed(12, c["pause"], 1),
        "hello-then-fin": bytes([1]) + frame(1, c["hello"]) + frame(6, c["fin"]),
        "pause-resume": bytes([6]) + frame(12, c["pause"]) + frame(12, struct.pack("<HB", 3, 0)) + frame(6, c["fin"]),
        "refused": bytes([4]) + frame(5, c["refuse"]),
        "number-then-fin": bytes([6]) + frame(14, c["number"]) + frame(15, c["numbered"]) + frame(6, c["fin"]),
        "keepalives-then-fin-ack": bytes([7]) + frame(16, b"") + frame(16, b"") +
                                   frame(7, c["fin-ack"]),
        "signed-keepalives": bytes([0x80 | 7]) + signed(16, b"", 0) + signed(16, b"", 1) + signed(7, c["fin-ack"], 2),
        "accept-setup-ready": bytes([4]) + frame(4, c["accept"]) + frame(10, c["setup"]) + frame(11, b""),
        "cut-short": bytes([9]) + frame(9, c["capacity"])[:-3],
        "zero-length": bytes([1]) + struct.pack("<I", 0),
    }
    rng = random.Random(13)
    seeds["delivery"] = {f"script-{i}": bytes(rng.randrange(256) for _ in range(n))
                         for i, n in enumerate((16, 64, 128, 256, 512, 1024))}
    seeds["dgram_header"] = dgram_seeds()
    # Session scripts (fuzz/dgram_session_fuzz.cc): protocol, shape, ring, largest message, then events.
    seeds["dgram_session"] = {f"script-{i}": bytes([i % 4, i * 37 % 256, 2, 0, 16]) +
                              bytes(rng.randrange(256) for _ in range(n))
                              for i, n in enumerate((32, 64, 128, 256, 512, 1024, 96, 200))}
    # gst/frame.h: one byte of piece size, then a slotstreamsink message (caps, buffer, end of stream).
    def gst_buffer(payload, pts=0):
        return (b"SSGF" + bytes([1, 2, 0, 0]) + struct.pack("<QQQQQQII", len(payload), pts, 2**64 - 1, 40000000, 0, 1,
                                                              0x40, 0) + struct.pack("<QQ", 123456789, 0) + payload)
    caps = b"video/x-raw, format=(string)RGB, width=(int)4, height=(int)2"
    seeds["gst_frame"] = {
        "caps": bytes([255]) + b"SSGF" + bytes([1, 1, 0, 0]) + struct.pack("<II", len(caps), 0) + caps,
        "buffer-in-pieces": bytes([6]) + gst_buffer(bytes(range(24))),
        "buffer-empty": bytes([79]) + gst_buffer(b""),
        "eos": bytes([0]) + b"SSGF" + bytes([1, 3, 0, 0]),
    }
    for target, files in seeds.items():
        d = pathlib.Path(root) / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)


if __name__ == "__main__":
    main(*sys.argv[1:2])
