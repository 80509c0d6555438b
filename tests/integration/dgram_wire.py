"""The datagram wire format (src/engine/dgram/wire/wire.h, control.h) written by hand, for tests that play a hostile or
broken peer: forged hellos, floods, injected segments. Nothing here is taken from the C++ code; the layouts are
the documented ones, so a test also checks that the documentation and the code agree.

  crc32c(data)                           CRC32C (RFC 3720 test vectors in tests/engine/dgram/wire/crc32c_test.cc)
  segment(version=2, ...)                one datagram: headers, payload, CRC32C
  hello(...), fin(...)                   control payloads of wire version 2 (or 1: the layout before issue 19)
  decode(datagram)                       (version, ddp flags, opcode, service, qp, payload) or None
  probe_version(addr)                    the wire version a receiver at HOST:PORT speaks (2, or 1 before issue 19)
  proof(token, label, *parts)            the handshake's HMAC (src/net/auth.h's net::proof)
  auth(nr, ns, hello_payload, token)     an AUTH payload answering a CHALLENGE
  accept(...)                            an ACCEPT payload (a fake receiver's answer)
  terminate(layer, code, reason)         a TERMINATE payload; parse_terminate(payload) -> (layer, code, reason)
"""
import hashlib
import hmac
import os
import socket
import struct

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


UD, RD, RC = 0, 1, 2
WRITE, SEND, TERMINATE, WRITE_RECORD, ACK = 0, 3, 7, 8, 15
CONTROL_QUEUE = 0xFFFFFFFF
TERMINATE_QUEUE = 2  # RFC 5040's Terminate queue


def segment(payload=b"", version=2, service=UD, opcode=SEND, qp=1, last=True, queue=CONTROL_QUEUE, msn=0, offset=0,
            stag=0, rd=None):
    """A whole datagram. Tagged opcodes (WRITE, WRITE_RECORD) use stag/offset/msn; SEND uses queue/msn/offset."""
    tagged = opcode in (WRITE, WRITE_RECORD)
    ddp = 0x01 | (0x80 if tagged else 0) | (0x40 if last else 0) | (0x20 if opcode == WRITE_RECORD else 0)
    h = b"SD" + bytes([version, ddp, 0x40 | opcode, service]) + struct.pack("<HI", len(payload), qp)
    if service == RD:
        seq, ack, credits, flags, sack = rd or (0, 0, 0, 1, 0)
        h += struct.pack("<IIIIQ", seq, ack, credits, flags, sack)
    if tagged:
        h += struct.pack("<IQ", stag, offset) + (struct.pack("<I", msn) if opcode == WRITE_RECORD else b"")
    elif opcode != ACK:
        h += struct.pack("<III", queue, msn, offset)
    body = h + payload
    return body + struct.pack("<I", crc32c(body))


def _str8(s):
    b = s.encode()
    return bytes([len(b)]) + b


def hello(protocol="write_record", name="x", ring=1, max_message=1024, segment_size=1024, devices=(0,), version=2,
          auth=False, nonce=None, pad_to=256):
    """A HELLO payload. Version 2 (issue 19): flags, a nonce and padding; version 1: the layout before it."""
    tail = struct.pack("<IQIH", ring, max_message, segment_size, len(devices)) + b"".join(
        struct.pack("<H", d) for d in devices)
    if version == 1:
        return b"\x01" + _str8(protocol) + _str8(name) + tail
    body = b"\x01" + bytes([1 if auth else 0]) + _str8(protocol) + _str8(name) + tail + (nonce or os.urandom(32))
    pad = max(0, pad_to - len(body) - 2)
    return body + struct.pack("<H", pad) + bytes(pad)


def proof(token, label, *parts):
    msg = b"slotstream-auth-v2" + bytes([len(label)]) + label.encode()
    for p in parts:
        msg += struct.pack("<I", len(p)) + p
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def auth(nr, ns, hello_payload, token):
    """AUTH (control.h): Nr | u16 length | the HELLO as sent | HMAC(token, "dgram-sender-hello", Nr, Ns, HELLO)."""
    return (b"\x07" + nr + struct.pack("<H", len(hello_payload)) + hello_payload +
            proof(token, "dgram-sender-hello", nr, ns, hello_payload))


def accept(qp=1, credits=0, region=1 << 20, first_stag=1, devices=1):
    """ACCEPT (control.h): u8 2 | u32 receiver QP | u32 RD credits | u64 region length | u32 first STag | u16 n
    | u8 0 (no proof)."""
    return b"\x02" + struct.pack("<IIQIHB", qp, credits, region, first_stag, devices, 0)


def terminate(layer, code, reason):
    """TERMINATE (control.h): u8 layer | u8 code | str8 reason; travels with opcode TERMINATE on queue 2."""
    return bytes([layer, code]) + _str8(reason)


def parse_terminate(payload):
    layer, code, n = payload[0], payload[1], payload[2]
    assert len(payload) == 3 + n, "a TERMINATE is exactly layer, code and its reason"
    return layer, code, payload[3:].decode()


def decode(d):
    if len(d) < 16 or d[:2] != b"SD" or struct.unpack("<I", d[-4:])[0] != crc32c(d[:-4]):
        return None
    version, ddp, rdmap, service = d[2], d[3], d[4], d[5]
    length, qp = struct.unpack("<HI", d[6:12])
    opcode = rdmap & 0x0F
    n = 12 + (24 if service == RD else 0)
    if opcode != ACK:
        n += 12 + (4 if opcode == WRITE_RECORD else 0)
    return version, ddp, opcode, service, qp, d[n:n + length]


REPLY_TYPES = {2: "ACCEPT", 3: "REFUSE", 5: "FIN_ACK", 6: "CHALLENGE"}


def reply_type(d):
    s = decode(d)
    return REPLY_TYPES.get(s[5][0], "?") if s and s[5] else None


def probe_version(addr, timeout=1.0):
    """Sends a harmless HELLO (a name no one uses, refused or accepted and then silent) in wire version 2, then 1;
    returns the version of the first answer (2 for this code; 1 for a receiver from before issue 19)."""
    host, port = addr.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        for v in (2, 1):
            s.sendto(segment(hello(name="probe-v%d" % v, version=v, protocol="nope"), version=v, qp=7),
                     (host, int(port)))
            try:
                d, _ = s.recvfrom(65536)
                return d[2]
            except socket.timeout:
                continue
    raise AssertionError(f"no datagram receiver answered at {addr}")
