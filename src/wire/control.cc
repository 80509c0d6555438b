#include "wire/control.h"

#include <algorithm>

#include "wire/codec.h"

namespace slotstream::wire {
namespace {

constexpr size_t kMaxBlob = kMaxFrame;

Status malformed(const char* what) { return {Code::kProtocolError, std::string("malformed ") + what}; }

// Every decoder ends here: the body must be consumed exactly.
Status finish(const Reader& r, const char* what) {
  if (!r.ok()) return {Code::kProtocolError, std::string("truncated ") + what};
  if (!r.at_end()) return {Code::kProtocolError, std::string("trailing bytes after ") + what};
  return Status::ok();
}

// A proof is absent (no token) or one MAC.
bool valid_proof(const std::vector<uint8_t>& proof) { return proof.empty() || proof.size() == kMacSize; }

}  // namespace

uint8_t encode_transport(Transport t) {
  switch (t) {
    case Transport::kAuto:
      return 0;
    case Transport::kShm:
      return 1;
    case Transport::kTcp:
      return 2;
    case Transport::kRdma:
      return 3;
    case Transport::kUdp:  // never in a HELLO: Sender refuses it
      break;
  }
  return 0;
}

std::optional<Transport> decode_transport(uint8_t code) {
  switch (code) {
    case 0:
      return Transport::kAuto;
    case 1:
      return Transport::kShm;
    case 2:
      return Transport::kTcp;
    case 3:
      return Transport::kRdma;
    default:
      return std::nullopt;
  }
}

uint8_t encode_rdma_transport(std::optional<RdmaTransport> t) {
  if (!t) return 0;
  switch (*t) {
    case RdmaTransport::kRc:
      return 1;
    case RdmaTransport::kDc:
      return 2;
    case RdmaTransport::kUd:
      return 3;
  }
  return 0;
}

bool decode_rdma_transport(uint8_t code, std::optional<RdmaTransport>* out) {
  constexpr RdmaTransport kByCode[] = {RdmaTransport::kRc, RdmaTransport::kDc, RdmaTransport::kUd};
  if (code > 3) return false;
  *out = code == 0 ? std::nullopt : std::optional(kByCode[code - 1]);
  return true;
}

std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> body) {
  Writer w;
  w.u32(static_cast<uint32_t>(body.size() + 1));
  w.u8(static_cast<uint8_t>(type));
  w.bytes(body);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode(const Hello& m) {
  Writer w;
  w.bytes(kMagic);
  w.u16(m.version);
  w.str8(m.protocol);
  w.str16(m.options);
  w.u32(m.blocks);
  w.u32(m.block_size);
  w.u8(encode_transport(m.transport));
  w.u8(encode_rdma_transport(m.rdma_transport));
  w.u8(m.offers);
  w.str8(m.host_id);
  w.str8(m.shm_domain);
  w.str8(m.name);
  w.u16(static_cast<uint16_t>(m.devices.size()));
  for (uint16_t d : m.devices) w.u16(d);
  w.u64(m.group);
  w.u16(m.lane);
  w.u16(m.lanes);
  w.u8(m.flags);
  if (m.flags & kHelloNumbered) {
    for (uint64_t f : m.first) w.u64(f);
  }
  w.bytes(m.nonce);
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, Hello* out) {
  Reader r(body);
  auto magic = r.bytes(kMagic.size());
  if (!r.ok() || !std::equal(magic.begin(), magic.end(), kMagic.begin())) {
    return {Code::kProtocolError, "bad magic (not a slotstream sender)"};
  }
  Hello h;
  h.version = r.u16();
  if (r.ok() && h.version != kProtocolVersion) {
    return {Code::kVersionMismatch, "unsupported version " + std::to_string(h.version) +
                                        " (this receiver speaks version " + std::to_string(kProtocolVersion) + ")"};
  }
  h.protocol = r.str8();
  h.options = r.str16();
  h.blocks = r.u32();
  h.block_size = r.u32();
  const auto t = decode_transport(r.u8());
  if (r.ok() && !t) return malformed("hello: unknown transport code");
  h.transport = t.value_or(Transport::kAuto);
  if (!decode_rdma_transport(r.u8(), &h.rdma_transport) && r.ok()) return malformed("hello: unknown rdma transport");
  h.offers = r.u8();
  if (r.ok() && (h.offers & ~kOfferMask) != 0) return malformed("hello: unknown offers");
  h.host_id = r.str8();
  h.shm_domain = r.str8();
  h.name = r.str8();
  uint16_t n = r.u16();
  for (uint16_t i = 0; i < n && r.ok(); ++i) h.devices.push_back(r.u16());
  h.group = r.u64();
  h.lane = r.u16();
  h.lanes = r.u16();
  h.flags = r.u8();
  if (r.ok() && (h.flags & ~(kHelloNumbered | kHelloConfirm))) return malformed("hello: unknown flags");
  if (h.flags & kHelloNumbered) {
    for (uint16_t i = 0; i < n && r.ok(); ++i) h.first.push_back(r.u64());
  }
  auto nonce = r.bytes(kNonceSize);
  if (r.ok()) std::copy(nonce.begin(), nonce.end(), h.nonce.begin());
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "hello"));
  if (h.lanes == 0 || h.lane >= h.lanes) return malformed("hello: lane numbers");
  *out = std::move(h);
  return Status::ok();
}

std::vector<uint8_t> signed_part(const Accept& m) {
  Writer w;
  w.u8(encode_transport(m.transport));
  w.u8(encode_rdma_transport(m.rdma_transport));
  w.u8(m.offers);
  w.str16(m.reason);
  w.blob32(m.worker_address);
  w.blob32(m.setup);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode(const Accept& m) {
  std::vector<uint8_t> b = signed_part(m);
  b.push_back(static_cast<uint8_t>(m.proof.size()));
  b.insert(b.end(), m.proof.begin(), m.proof.end());
  return b;
}

Status decode(std::span<const uint8_t> body, Accept* out) {
  Reader r(body);
  Accept a;
  const auto t = decode_transport(r.u8());
  if (r.ok() && (!t || *t == Transport::kAuto)) return malformed("accept: transport");
  a.transport = t.value_or(Transport::kShm);
  if (!decode_rdma_transport(r.u8(), &a.rdma_transport) && r.ok()) return malformed("accept: rdma transport");
  if (r.ok() && a.rdma_transport.has_value() != (a.transport == Transport::kRdma)) {
    return malformed("accept: an rdma transport goes with rdma only");
  }
  a.offers = r.u8();
  if (r.ok() && (a.offers & ~kOfferMask) != 0) return malformed("accept: unknown offers");
  a.reason = r.str16();
  a.worker_address = r.blob32(kMaxBlob);
  a.setup = r.blob32(kMaxBlob);
  auto proof = r.bytes(r.u8());
  a.proof.assign(proof.begin(), proof.end());
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "accept"));
  if (!valid_proof(a.proof)) return malformed("accept: proof length");
  *out = std::move(a);
  return Status::ok();
}

std::vector<uint8_t> signed_part(const Setup& m) {
  Writer w;
  w.blob32(m.worker_address);
  w.blob32(m.setup);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode(const Setup& m) {
  std::vector<uint8_t> b = signed_part(m);
  b.push_back(static_cast<uint8_t>(m.proof.size()));
  b.insert(b.end(), m.proof.begin(), m.proof.end());
  return b;
}

Status decode(std::span<const uint8_t> body, Setup* out) {
  Reader r(body);
  Setup m;
  m.worker_address = r.blob32(kMaxBlob);
  m.setup = r.blob32(kMaxBlob);
  auto proof = r.bytes(r.u8());
  m.proof.assign(proof.begin(), proof.end());
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "setup"));
  if (!valid_proof(m.proof)) return malformed("setup: proof length");
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const Refuse& m) {
  Writer w;
  w.u16(static_cast<uint16_t>(m.code));
  w.str16(m.message);
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, Refuse* out) {
  Reader r(body);
  Refuse m;
  uint16_t code = r.u16();
  // A refusal is an error whatever the peer wrote: unknown codes and the two that are not errors
  // (kOk, kInProgress — with kOk, ControlSocket::expect took a REFUSE for success) read as kRefused.
  const bool error_code = code > static_cast<uint16_t>(Code::kInProgress) && code <= static_cast<uint16_t>(Code::kBusy);
  m.code = error_code ? static_cast<Code>(code) : Code::kRefused;
  m.message = r.str16();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "refuse"));
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const Fin& m) {
  Writer w;
  w.u16(static_cast<uint16_t>(m.messages.size()));
  for (auto [dev, n] : m.messages) {
    w.u16(dev);
    w.u64(n);
  }
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, Fin* out) {
  Reader r(body);
  Fin m;
  uint16_t n = r.u16();
  if (r.ok() && n > kMaxDevices) return malformed("fin: more devices than a connection may declare");
  for (uint16_t i = 0; i < n && r.ok(); ++i) {
    uint16_t dev = r.u16();
    if (!m.messages.emplace(dev, r.u64()).second) return malformed("fin: a device counted twice");
  }
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "fin"));
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const Pause& m) {
  Writer w;
  w.u16(m.device);
  w.u8(m.paused ? 1 : 0);
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, Pause* out) {
  Reader r(body);
  Pause m;
  m.device = r.u16();
  const uint8_t paused = r.u8();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "pause"));
  if (paused > 1) return malformed("pause: flag");
  m.paused = paused == 1;
  *out = m;
  return Status::ok();
}

std::vector<uint8_t> encode(const Stored& m) {
  Writer w;
  w.u16(static_cast<uint16_t>(m.devices.size()));
  for (const auto& [dev, c] : m.devices) {
    w.u16(dev);
    w.u64(c.first);
    w.u64(c.stored);
  }
  return std::move(w.buffer());
}

std::vector<std::vector<uint8_t>> split_stored(const Stored& m) {
  std::vector<std::vector<uint8_t>> out;
  Stored part;
  for (const auto& [d, c] : m.devices) {
    part.devices.emplace(d, c);
    if (part.devices.size() == kMaxStoredDevices) {
      out.push_back(encode(part));
      part.devices.clear();
    }
  }
  if (!part.devices.empty() || out.empty()) out.push_back(encode(part));
  return out;
}

Status decode(std::span<const uint8_t> body, Stored* out) {
  Reader r(body);
  Stored m;
  uint16_t n = r.u16();
  for (uint16_t i = 0; i < n && r.ok(); ++i) {
    uint16_t dev = r.u16();
    Stored::Device c;
    c.first = r.u64();
    c.stored = r.u64();
    if (r.ok() && !m.devices.empty() && dev <= m.devices.rbegin()->first) {
      return malformed("stored: devices out of order");
    }
    m.devices.emplace(dev, c);
  }
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "stored"));
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const Number& m) {
  Writer w;
  w.u16(m.device);
  w.u64(m.number);
  return std::move(w.buffer());
}
Status decode(std::span<const uint8_t> body, Number* out) {
  Reader r(body);
  Number m;
  m.device = r.u16();
  m.number = r.u64();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "number"));
  *out = m;
  return Status::ok();
}

std::vector<uint8_t> encode(const Numbered& m) {
  Writer w;
  w.u16(m.device);
  w.u64(m.number);
  w.u8(m.ok ? 1 : 0);
  w.str16(m.message);
  return std::move(w.buffer());
}
Status decode(std::span<const uint8_t> body, Numbered* out) {
  Reader r(body);
  Numbered m;
  m.device = r.u16();
  m.number = r.u64();
  const uint8_t ok = r.u8();
  m.message = r.str16();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "numbered"));
  if (ok > 1) return malformed("numbered: flag");
  m.ok = ok == 1;
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const FinAck& m) {
  Writer w;
  w.u8(m.ok ? 1 : 0);
  w.u64(m.stored);
  w.str16(m.message);
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, FinAck* out) {
  Reader r(body);
  FinAck m;
  m.ok = r.u8() == 1;
  m.stored = r.u64();
  m.message = r.str16();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "fin_ack"));
  *out = std::move(m);
  return Status::ok();
}

std::vector<uint8_t> encode(const CapacityInfo& m) {
  Writer w;
  w.u32(m.senders);
  w.u64(m.backlog_bytes);
  w.u32(m.load_milli);
  w.u64(m.shm_free_bytes);
  return std::move(w.buffer());
}

Status decode(std::span<const uint8_t> body, CapacityInfo* out) {
  Reader r(body);
  CapacityInfo m;
  m.senders = r.u32();
  m.backlog_bytes = r.u64();
  m.load_milli = r.u32();
  m.shm_free_bytes = r.u64();
  SLOTSTREAM_RETURN_IF_ERROR(finish(r, "capacity"));
  *out = m;
  return Status::ok();
}

std::vector<uint8_t> encode_capacity_request() {
  Writer w;
  w.bytes(kMagic);
  w.u16(kProtocolVersion);
  return std::move(w.buffer());
}

Status decode_capacity_request(std::span<const uint8_t> body) {
  Reader r(body);
  auto magic = r.bytes(kMagic.size());
  if (!r.ok() || !std::equal(magic.begin(), magic.end(), kMagic.begin())) {
    return {Code::kProtocolError, "bad magic (not a slotstream sender)"};
  }
  uint16_t version = r.u16();
  if (r.ok() && version != kProtocolVersion) {
    return {Code::kVersionMismatch, "unsupported version " + std::to_string(version)};
  }
  return finish(r, "capacity request");
}

Status decode_keepalive(std::span<const uint8_t> body) {
  if (!body.empty()) return {Code::kProtocolError, "malformed keepalive: " + std::to_string(body.size()) + " bytes"};
  return Status::ok();
}

}  // namespace slotstream::wire
