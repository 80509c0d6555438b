#include "engine/dgram/wire/wire.h"

#include <cstring>

#include "engine/dgram/wire/crc32c.h"
#include "engine/dgram/wire/mac.h"
#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

using wire::get_le;
using wire::put_le;

uint8_t byte_at(const std::byte* p, size_t i) { return std::to_integer<uint8_t>(p[i]); }

bool known_opcode(uint8_t op) {
  switch (static_cast<Opcode>(op)) {
    case Opcode::kWrite:
    case Opcode::kSend:
    case Opcode::kTerminate:
    case Opcode::kWriteRecord:
    case Opcode::kAck:
      return true;
  }
  return false;
}

}  // namespace

bool is_tagged(Opcode op) { return op == Opcode::kWrite || op == Opcode::kWriteRecord; }

size_t header_size(const SegmentHeader& h) {
  size_t n = kCommonSize;
  if (h.service == Service::kRD) n += kRdSize;
  if (h.opcode == Opcode::kAck) return n;
  if (is_tagged(h.opcode)) return n + kTaggedSize + (h.has_msn ? 4 : 0);
  return n + kUntaggedSize;
}

size_t encode_header(const SegmentHeader& h, size_t payload_length, std::span<std::byte> out) {
  const size_t size = header_size(h);
  std::byte* p = out.data();
  const bool tagged = is_tagged(h.opcode);
  p[0] = std::byte{kMagic0};
  p[1] = std::byte{kMagic1};
  p[2] = std::byte{kWireVersion};
  uint8_t ddp = kDdpVersion;
  if (tagged) ddp |= kDdpTagged;
  if (h.last) ddp |= kDdpLast;
  if (tagged && h.has_msn) ddp |= kDdpMsn;
  if (h.has_mac) ddp |= kDdpMac;
  p[3] = std::byte{ddp};
  p[4] = static_cast<std::byte>((kRdmapVersion << 6) | static_cast<uint8_t>(h.opcode));
  p[5] = static_cast<std::byte>(h.service);
  put_le(p + 6, payload_length, 2);
  put_le(p + 8, h.source_qp, 4);
  std::byte* q = p + kCommonSize;
  if (h.service == Service::kRD) {
    put_le(q + 0, h.rd.seq, 4);
    put_le(q + 4, h.rd.ack, 4);
    put_le(q + 8, h.rd.credits, 4);
    put_le(q + 12, h.rd.flags, 4);
    put_le(q + 16, h.rd.sack, 8);
    q += kRdSize;
  }
  if (h.opcode == Opcode::kAck) return size;
  if (tagged) {
    put_le(q + 0, h.stag, 4);
    put_le(q + 4, h.offset, 8);
    if (h.has_msn) put_le(q + 12, h.msn, 4);
  } else {
    put_le(q + 0, h.queue, 4);
    put_le(q + 4, h.msn, 4);
    put_le(q + 8, h.offset, 4);
  }
  return size;
}

void put_crc(uint32_t crc, std::span<std::byte, kCrcSize> out) { put_le(out.data(), crc, 4); }

size_t encode_segment(const SegmentHeader& header, std::span<const std::byte> payload, std::span<std::byte> out,
                      SegmentMac* mac) {
  SegmentHeader h = header;
  h.has_mac = mac != nullptr;
  const size_t hs = header_size(h);
  const size_t total = segment_size(h, payload.size());
  if (payload.size() > 0xFFFF || out.size() < total) return 0;
  encode_header(h, payload.size(), out);
  if (!payload.empty()) std::memcpy(out.data() + hs, payload.data(), payload.size());
  size_t body = hs + payload.size();
  if (mac) {
    mac->sign({out.first(body)}, std::span<std::byte, kMacTagSize>(out.data() + body, kMacTagSize));
    body += kMacTagSize;
  }
  put_crc(crc32c(out.first(body)), std::span<std::byte, kCrcSize>(out.data() + body, kCrcSize));
  return total;
}

std::optional<Segment> decode_segment(std::span<const std::byte> d, DecodeError* why) {
  auto fail = [&](DecodeError e) -> std::optional<Segment> {
    if (why) *why = e;
    return std::nullopt;
  };
  if (d.size() < kCommonSize + kCrcSize) return fail(DecodeError::kShort);
  const size_t body = d.size() - kCrcSize;
  if (static_cast<uint32_t>(get_le(d.data() + body, 4)) != crc32c(d.first(body))) return fail(DecodeError::kCrc);
  const std::byte* p = d.data();
  if (byte_at(p, 0) != kMagic0 || byte_at(p, 1) != kMagic1) return fail(DecodeError::kMagic);
  if (byte_at(p, 2) != kWireVersion) return fail(DecodeError::kVersion);
  const uint8_t ddp = byte_at(p, 3), rdmap = byte_at(p, 4), service = byte_at(p, 5);
  if ((ddp & 0x03) != kDdpVersion || (rdmap >> 6) != kRdmapVersion) return fail(DecodeError::kVersion);
  if ((ddp & 0x0C) || (rdmap & 0x30)) return fail(DecodeError::kReserved);
  if (service > static_cast<uint8_t>(Service::kRC)) return fail(DecodeError::kService);
  const uint8_t op = rdmap & 0x0F;
  if (!known_opcode(op)) return fail(DecodeError::kOpcode);

  SegmentHeader h;
  h.service = static_cast<Service>(service);
  h.opcode = static_cast<Opcode>(op);
  const bool tagged = ddp & kDdpTagged;
  // The T bit must agree with the operation; acknowledgements exist only in RD.
  if (h.opcode == Opcode::kAck ? (h.service != Service::kRD || tagged || !(ddp & kDdpLast))
                               : tagged != is_tagged(h.opcode)) {
    return fail(DecodeError::kOpcode);
  }
  if (!tagged && (ddp & kDdpMsn)) return fail(DecodeError::kReserved);
  h.last = ddp & kDdpLast;
  h.has_msn = tagged && (ddp & kDdpMsn);
  h.has_mac = ddp & kDdpMac;
  const size_t payload_length = get_le(p + 6, 2);
  h.source_qp = static_cast<uint32_t>(get_le(p + 8, 4));
  const size_t hs = header_size(h);
  const size_t mac_size = h.has_mac ? kMacTagSize : 0;
  if (hs + payload_length + mac_size != body) return fail(DecodeError::kLength);
  const std::byte* q = p + kCommonSize;
  if (h.service == Service::kRD) {
    h.rd.seq = static_cast<uint32_t>(get_le(q + 0, 4));
    h.rd.ack = static_cast<uint32_t>(get_le(q + 4, 4));
    h.rd.credits = static_cast<uint32_t>(get_le(q + 8, 4));
    h.rd.flags = static_cast<uint32_t>(get_le(q + 12, 4));
    h.rd.sack = get_le(q + 16, 8);
    if (h.rd.flags & ~(kRdSeqValid | kRdAckValid | kRdProbe)) return fail(DecodeError::kReserved);
    // A data segment is sequenced; an acknowledgement is not.
    if (bool(h.rd.flags & kRdSeqValid) == (h.opcode == Opcode::kAck)) return fail(DecodeError::kReserved);
    q += kRdSize;
  }
  if (h.opcode == Opcode::kAck) {
    if (payload_length != 0) return fail(DecodeError::kLength);
  } else if (tagged) {
    h.stag = static_cast<uint32_t>(get_le(q + 0, 4));
    h.offset = get_le(q + 4, 8);
    if (h.has_msn) h.msn = static_cast<uint32_t>(get_le(q + 12, 4));
  } else {
    h.queue = static_cast<uint32_t>(get_le(q + 0, 4));
    h.msn = static_cast<uint32_t>(get_le(q + 4, 4));
    h.offset = get_le(q + 8, 4);
  }
  if (why) *why = DecodeError::kNone;
  return Segment{h, d.subspan(hs, payload_length), d.first(hs + payload_length),
                 d.subspan(hs + payload_length, mac_size)};
}

const char* decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kNone:
      return "none";
    case DecodeError::kShort:
      return "shorter than a segment";
    case DecodeError::kCrc:
      return "CRC32C mismatch";
    case DecodeError::kMagic:
      return "not a slotstream datagram (magic)";
    case DecodeError::kVersion:
      return "unknown version";
    case DecodeError::kService:
      return "unknown service";
    case DecodeError::kOpcode:
      return "unknown or misplaced opcode";
    case DecodeError::kReserved:
      return "reserved bits set";
    case DecodeError::kLength:
      return "payload length does not match the datagram";
  }
  return "?";
}

}  // namespace slotstream::dgram
