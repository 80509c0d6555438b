// The datagram RDMA wire format: one DDP segment per UDP datagram (patent: "each DDP message will
// be encapsulated into one UDP datagram, no markers are required"), shaped after iWARP's DDP
// (RFC 5041) and RDMAP (RFC 5040) headers, with the patent's additions: a message sequence
// number on tagged segments (flagged by a reserved DDP bit), a queue number on untagged ones, an
// optional reliable-datagram (RD) block, an optional MAC (authenticated sessions: `--token-file`, the
// shim's SLOTSTREAM_UDP_KEY_FILE) and a CRC32C trailer on every segment.
//
// The CRC detects corruption, nothing more: anyone who can send a datagram to the receiver can compute
// it. Only the MAC (engine/dgram/wire/mac.h) tells a session's datagrams from forged or injected ones.
//
// Unlike the RFCs (network byte order) every integer is little-endian, like every slotstream
// header, on every platform. Unknown versions are rejected: no silent forward compatibility.
//
// Common part, 12 bytes:
//
//   byte  0        1        2        3        4        5        6        7
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     0 |  'S'   |  'D'   | version|DDP ctrl|RDMAPctl| service| payload length  |
//       +--------+--------+--------+--------+--------+--------+-----(u16 LE)----+
//     8 |     source QP number (u32 LE)     |
//       +--------+--------+--------+--------+
//
//   DDP control (RFC 5041 §4.2, same bit order):  T(0x80) tagged, L(0x40) last segment of its
//                 message, M(0x20) MSN present (tagged only; the patent's "reserved bit ... to
//                 indicate that an MSN is present"), A(0x10) a MAC follows the payload (wire
//                 version 2), 0x0C reserved (0), DV(0x03) = 1.
//   RDMAP control (RFC 5040 §4.3): RV(0xC0) = 1 (as 0x40), 0x30 reserved (0), opcode(0x0F):
//                 0 RDMA Write, 3 Send, 7 Terminate (RFC 5040 numbers), 8 RDMA Write-Record
//                 (the patent's new operation), 15 LLP acknowledgement (RD only, no DDP part).
//   service:      0 UD (unreliable datagram), 1 RD (reliable datagram), 2 RC (the same RDMAP
//                 over a TCP stream, for comparison).
//   payload length: bytes of payload after the headers (the datagram must be exactly headers +
//                 payload + 4).
//
// Then, only when service = RD (24 bytes) — the lower layer's reliability (patent: "For the RD
// service, the LLP is assumed to guarantee that messages from a specific data source are
// delivered correctly and in-order"):
//
//    +0 sequence number (u32)   +4 cumulative ack: next sequence expected from the peer (u32)
//    +8 credits: sequences beyond the ack the peer may send (u32)
//   +12 flags (u32): 1 sequence valid, 2 ack valid, 4 probe (asks for an ack); others 0
//   +16 selective ack (u64): bit i set = sequence ack+1+i was received
//
// Then the DDP part: tagged (T = 1; RDMA Write, Write-Record), 12 or 16 bytes:
//
//    +0 STag (u32)   +4 tagged offset TO (u64)   [+12 MSN (u32), when M]
//
// or untagged (T = 0; Send, Terminate), 12 bytes (RFC 5041 §4.4 without the ULP-reserved word):
//
//    +0 queue number QN (u32)   +4 MSN (u32)   +8 message offset MO (u32)
//
// The LLP acknowledgement (opcode 15) has no DDP part and no payload. Then payload, then, when A:
//
//   MAC (16 bytes): HMAC-SHA256 under the session's key for this direction, truncated, over every
//                   byte before it (headers and payload; engine/dgram/wire/mac.h)
//
// and last:
//
//   CRC32C (u32 LE) over every byte before it (RFC 3720 §B.4 polynomial; engine/dgram/wire/crc32c.h).
//
// Version 2 (this one) added A and the authenticated handshake (engine/dgram/wire/control.h); a version-1 peer
// is refused at the first datagram (kVersion), as is any other version.
//
// A segment whose CRC fails is reported as kCrc before any field is trusted, so a corrupted
// datagram is never taken for a different one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace slotstream::dgram {

inline constexpr uint8_t kMagic0 = 'S';
inline constexpr uint8_t kMagic1 = 'D';
inline constexpr uint8_t kWireVersion = 2;
inline constexpr uint8_t kDdpVersion = 1;    // RFC 5041 DV
inline constexpr uint8_t kRdmapVersion = 1;  // RFC 5040 RV

inline constexpr size_t kCommonSize = 12;
inline constexpr size_t kRdSize = 24;
inline constexpr size_t kTaggedSize = 12;  // + 4 with MSN
inline constexpr size_t kUntaggedSize = 12;
inline constexpr size_t kCrcSize = 4;
inline constexpr size_t kMacTagSize = 16;
inline constexpr size_t kMaxHeaderSize = kCommonSize + kRdSize + kTaggedSize + 4;
// What follows the payload at most: the MAC and the CRC.
inline constexpr size_t kMaxTrailerSize = kMacTagSize + kCrcSize;
// The largest UDP payload over IPv4 (65,535 - 20 IP - 8 UDP); IPv6 allows 65,527.
inline constexpr size_t kMaxUdpPayload = 65507;
inline constexpr size_t kMaxSegmentPayload = kMaxUdpPayload - kMaxHeaderSize - kMaxTrailerSize;
static_assert(kMaxSegmentPayload <= 0xFFFF, "payload length is a u16");

enum class Service : uint8_t { kUD = 0, kRD = 1, kRC = 2 };
enum class Opcode : uint8_t { kWrite = 0, kSend = 3, kTerminate = 7, kWriteRecord = 8, kAck = 15 };

inline constexpr uint8_t kDdpTagged = 0x80;
inline constexpr uint8_t kDdpLast = 0x40;
inline constexpr uint8_t kDdpMsn = 0x20;
inline constexpr uint8_t kDdpMac = 0x10;

inline constexpr uint32_t kRdSeqValid = 1;
inline constexpr uint32_t kRdAckValid = 2;
inline constexpr uint32_t kRdProbe = 4;

struct RdFields {
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint32_t credits = 0;
  uint32_t flags = 0;
  uint64_t sack = 0;
  bool operator==(const RdFields&) const = default;
};

// Everything in a segment's headers. Which fields are meaningful follows from opcode:
// tagged ops (kWrite, kWriteRecord) use stag/offset (and msn when has_msn); untagged ops
// (kSend, kTerminate) use queue/msn/offset (MO); kAck has none of them.
struct SegmentHeader {
  Service service = Service::kUD;
  Opcode opcode = Opcode::kSend;
  bool last = true;      // L: the message's last segment
  bool has_msn = false;  // M: tagged segments only
  bool has_mac = false;  // A: a MAC follows the payload
  uint32_t source_qp = 0;
  RdFields rd;         // service == kRD only
  uint32_t stag = 0;   // tagged
  uint32_t queue = 0;  // untagged (QN)
  uint32_t msn = 0;
  uint64_t offset = 0;  // TO (tagged, u64) or MO (untagged, u32)
  bool operator==(const SegmentHeader&) const = default;
};

bool is_tagged(Opcode op);
// Bytes of headers before the payload (without the CRC trailer).
size_t header_size(const SegmentHeader& h);
// Bytes after the payload: the MAC (when h.has_mac) and the CRC.
inline size_t trailer_size(const SegmentHeader& h) { return (h.has_mac ? kMacTagSize : 0) + kCrcSize; }
// The whole segment's size for a payload of `payload_length` bytes.
inline size_t segment_size(const SegmentHeader& h, size_t payload_length) {
  return header_size(h) + payload_length + trailer_size(h);
}

class SegmentMac;

// Writes h's headers for a payload of `payload_length` bytes into out (at least
// header_size(h) bytes) and returns the header size. The CRC is the caller's last step:
// crc32c over headers + payload, appended with put_crc().
size_t encode_header(const SegmentHeader& h, size_t payload_length, std::span<std::byte> out);
void put_crc(uint32_t crc, std::span<std::byte, kCrcSize> out);

// Encodes a whole segment (headers, payload copy, MAC, CRC) into out; returns its length, or 0 if
// out is too small or the payload longer than a u16. With `mac`, the A flag is set and the segment
// signed whatever h.has_mac says; without, h.has_mac must be false.
size_t encode_segment(const SegmentHeader& h, std::span<const std::byte> payload, std::span<std::byte> out,
                      SegmentMac* mac = nullptr);

enum class DecodeError {
  kNone,
  kShort,  // shorter than the smallest segment
  kCrc,    // CRC32C mismatch: corrupted, or not a slotstream datagram at all
  kMagic,
  kVersion,  // wire, DDP or RDMAP version unknown
  kService,
  kOpcode,    // unknown, or not allowed with this service / tagging
  kReserved,  // reserved bits set
  kLength,    // payload length does not match the datagram
};
const char* decode_error_name(DecodeError e);

struct Segment {
  SegmentHeader header;
  std::span<const std::byte> payload;       // points into the decoded datagram
  std::span<const std::byte> signed_bytes;  // headers and payload: what the MAC covers
  std::span<const std::byte> mac;           // kMacTagSize bytes when header.has_mac, else empty
};

// Checks length, then CRC, then every field. *why says what failed (kNone on success).
std::optional<Segment> decode_segment(std::span<const std::byte> datagram, DecodeError* why = nullptr);

}  // namespace slotstream::dgram
