#!/usr/bin/env python3
"""Writes the seed corpus of dgram_header_fuzz (fuzz/corpus/dgram_header/): one valid segment of every shape
src/dgram/wire.h defines, plus control payloads, each with its CRC32C (the layouts are documented there)."""
import pathlib
import struct

POLY = 0x82F63B78  # CRC32C, reflected


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (POLY if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def segment(service, opcode, ddp_flags, extra, payload, rd=None):
    common = b"SD" + bytes([1, ddp_flags | 1, 0x40 | opcode, service]) + struct.pack("<HI", len(payload), 0x1234)
    rdb = struct.pack("<IIIIQ", *rd) if rd else b""
    body = common + rdb + extra + payload
    return body + struct.pack("<I", crc32c(body))


T, L, M = 0x80, 0x40, 0x20
out = pathlib.Path(__file__).resolve().parent / "corpus" / "dgram_header"
out.mkdir(parents=True, exist_ok=True)
hello = bytes([1, 12]) + b"write_record" + bytes([3]) + b"cam" + struct.pack("<IQIH", 4, 1 << 20, 8192, 2) + \
    struct.pack("<HH", 0, 1)
fin = bytes([4]) + struct.pack("<H", 1) + struct.pack("<HQQ", 0, 10, 10000)
seeds = {
    "write_record_last": segment(0, 8, T | L | M, struct.pack("<IQI", 5, 8192, 7), b"\x11" * 100),
    "write_record_middle": segment(0, 8, T | M, struct.pack("<IQI", 5, 0, 7), b"\x22" * 64),
    "rdma_write_rc": segment(2, 0, T, struct.pack("<IQ", 9, 4096), b"\x33" * 32),
    "send_ud": segment(0, 3, L, struct.pack("<III", 2, 3, 0), b"hello"),
    "send_rd": segment(1, 3, L, struct.pack("<III", 0, 0, 0), b"rd", rd=(7, 0, 0, 1, 0)),
    "ack_rd": segment(1, 15, L, b"", b"", rd=(0, 8, 512, 2, 0b101)),
    "control_hello": segment(0, 3, L, struct.pack("<III", 0xFFFFFFFF, 0, 0), hello),
    "control_fin": segment(0, 3, L, struct.pack("<III", 0xFFFFFFFF, 1, 0), fin),
    "shim_send": segment(0, 3, L, struct.pack("<III", 0, 42, 0), b"\x47" + b"\x00" * 187),
}
for name, data in seeds.items():
    (out / name).write_bytes(data)
print(f"wrote {len(seeds)} seeds to {out}")
