#include "engine/dgram/wire/control.h"

#include <algorithm>

#include "engine/dgram/wire/wire.h"
#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

using wire::Reader;
using wire::Writer;

Writer start(ControlType t) {
  Writer w;
  w.u8(static_cast<uint8_t>(t));
  return w;
}

// A reader past the type byte of a payload that has type t, or nullopt.
std::optional<Reader> open(std::span<const uint8_t> p, ControlType t) {
  if (control_type(p) != t) return std::nullopt;
  Reader r(p);
  r.u8();
  return r;
}

template <class T>
std::optional<T> done(const Reader& r, T value) {
  if (!r.ok() || !r.at_end()) return std::nullopt;
  return value;
}

void pad(Writer& w, uint16_t n) {
  w.u16(n);
  w.buffer().resize(w.buffer().size() + n, 0);
}

// Reads `u16 p | p x 0`; false if any padding byte is not zero.
bool read_padding(Reader& r, uint16_t* n) {
  *n = r.u16();
  for (uint8_t b : r.bytes(*n)) {
    if (b != 0) return false;
  }
  return r.ok();
}

template <size_t N>
void read_array(Reader& r, std::array<uint8_t, N>* out) {
  auto b = r.bytes(N);
  if (b.size() == N) std::copy(b.begin(), b.end(), out->begin());
}

void part_header(Writer& w, uint16_t total, uint16_t first, size_t n) {
  w.u16(total);
  w.u16(first);
  w.u16(static_cast<uint16_t>(n));
}

// A part's header, checked: n devices from `first`, inside `total`, at most kFinPartDevices.
bool read_part_header(Reader& r, uint16_t* total, uint16_t* first, uint16_t* n) {
  *total = r.u16();
  *first = r.u16();
  *n = r.u16();
  return r.ok() && *n <= kFinPartDevices && size_t(*first) + *n <= *total;
}

}  // namespace

std::vector<uint8_t> encode_control(const Hello& m) {
  Writer w = start(ControlType::kHello);
  w.u8(m.flags);
  w.str8(m.protocol);
  w.str8(m.name);
  w.u32(m.ring);
  w.u64(m.max_message);
  w.u32(m.segment_size);
  w.u16(static_cast<uint16_t>(m.devices.size()));
  for (uint16_t d : m.devices) w.u16(d);
  w.bytes(m.nonce);
  pad(w, m.padding);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Accept& m) {
  Writer w = start(ControlType::kAccept);
  w.u32(m.receiver_qp);
  w.u32(m.credits);
  w.u64(m.region_length);
  w.u32(m.first_stag);
  w.u16(m.devices);
  w.u8(static_cast<uint8_t>(m.proof.size()));
  w.bytes(m.proof);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Refuse& m) {
  Writer w = start(ControlType::kRefuse);
  w.str8(m.reason.substr(0, 255));
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Fin& m) {
  Writer w = start(ControlType::kFin);
  part_header(w, m.total, m.first, m.devices.size());
  for (const auto& d : m.devices) {
    w.u16(d.device);
    w.u64(d.messages);
    w.u64(d.bytes);
  }
  pad(w, m.padding);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const FinAck& m) {
  Writer w = start(ControlType::kFinAck);
  part_header(w, m.total, m.first, m.devices.size());
  for (const auto& d : m.devices) {
    w.u16(d.device);
    w.u64(d.counts.complete);
    w.u64(d.counts.partial);
    w.u64(d.counts.dropped);
    w.u64(d.counts.lost);
    w.u64(d.counts.valid_bytes);
  }
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Challenge& m) {
  Writer w = start(ControlType::kChallenge);
  w.bytes(m.nonce);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Auth& m) {
  Writer w = start(ControlType::kAuth);
  w.bytes(m.receiver_nonce);
  w.u16(static_cast<uint16_t>(m.hello.size()));
  w.bytes(m.hello);
  w.bytes(m.proof);
  return std::move(w.buffer());
}

std::optional<ControlType> control_type(std::span<const uint8_t> p) {
  if (p.empty() || p[0] < uint8_t(ControlType::kHello) || p[0] > uint8_t(ControlType::kAnnounce)) return std::nullopt;
  return static_cast<ControlType>(p[0]);
}

std::optional<Hello> decode_hello(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kHello);
  if (!r) return std::nullopt;
  Hello m;
  m.flags = r->u8();
  if (m.flags & ~kHelloAuth) return std::nullopt;
  m.protocol = r->str8();
  m.name = r->str8();
  m.ring = r->u32();
  m.max_message = r->u64();
  m.segment_size = r->u32();
  uint16_t n = r->u16();
  if (n > kMaxHelloDevices) return std::nullopt;
  m.devices.reserve(n);
  for (uint16_t i = 0; i < n && r->ok(); ++i) m.devices.push_back(r->u16());
  read_array(*r, &m.nonce);
  if (!read_padding(*r, &m.padding)) return std::nullopt;
  return done(*r, std::move(m));
}

std::optional<Accept> decode_accept(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kAccept);
  if (!r) return std::nullopt;
  Accept m;
  m.receiver_qp = r->u32();
  m.credits = r->u32();
  m.region_length = r->u64();
  m.first_stag = r->u32();
  m.devices = r->u16();
  const uint8_t k = r->u8();
  if (k != 0 && k != kDgramProofSize) return std::nullopt;
  auto proof = r->bytes(k);
  m.proof.assign(proof.begin(), proof.end());
  return done(*r, std::move(m));
}

std::optional<Refuse> decode_refuse(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kRefuse);
  if (!r) return std::nullopt;
  Refuse m{r->str8()};
  return done(*r, std::move(m));
}

std::optional<Fin> decode_fin(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kFin);
  if (!r) return std::nullopt;
  Fin m;
  uint16_t n = 0;
  if (!read_part_header(*r, &m.total, &m.first, &n)) return std::nullopt;
  for (uint16_t i = 0; i < n && r->ok(); ++i) {
    Fin::Device d;
    d.device = r->u16();
    d.messages = r->u64();
    d.bytes = r->u64();
    m.devices.push_back(d);
  }
  if (!read_padding(*r, &m.padding)) return std::nullopt;
  return done(*r, std::move(m));
}

std::optional<FinAck> decode_fin_ack(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kFinAck);
  if (!r) return std::nullopt;
  FinAck m;
  uint16_t n = 0;
  if (!read_part_header(*r, &m.total, &m.first, &n)) return std::nullopt;
  for (uint16_t i = 0; i < n && r->ok(); ++i) {
    FinAck::Device d;
    d.device = r->u16();
    d.counts.complete = r->u64();
    d.counts.partial = r->u64();
    d.counts.dropped = r->u64();
    d.counts.lost = r->u64();
    d.counts.valid_bytes = r->u64();
    m.devices.push_back(d);
  }
  return done(*r, std::move(m));
}

std::optional<Challenge> decode_challenge(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kChallenge);
  if (!r) return std::nullopt;
  Challenge m;
  read_array(*r, &m.nonce);
  return done(*r, m);
}

std::optional<Auth> decode_auth(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kAuth);
  if (!r) return std::nullopt;
  Auth m;
  read_array(*r, &m.receiver_nonce);
  auto hello = r->bytes(r->u16());
  m.hello.assign(hello.begin(), hello.end());
  read_array(*r, &m.proof);
  return done(*r, std::move(m));
}

std::vector<uint8_t> encode_control(const Announce& m) {
  Writer w = start(ControlType::kAnnounce);
  w.u32(m.first_stag);
  const std::vector<uint8_t> hello = encode_control(m.hello);
  w.u16(static_cast<uint16_t>(hello.size()));
  w.bytes(hello);
  return std::move(w.buffer());
}

std::optional<Announce> decode_announce(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kAnnounce);
  if (!r) return std::nullopt;
  Announce m;
  m.first_stag = r->u32();
  const uint16_t n = r->u16();
  auto hello = decode_hello(r->bytes(n));
  if (!hello || hello->flags != 0) return std::nullopt;
  m.hello = std::move(*hello);
  return done(*r, std::move(m));
}

// ------------------------------------------------------------------ TERMINATE

const char* terminate_code_name(TerminateCode c) {
  switch (c) {
    case TerminateCode::kProtocol:
      return "protocol error";
    case TerminateCode::kPlacement:
      return "placement out of range";
    case TerminateCode::kCrc:
      return "CRC failures";
    case TerminateCode::kHandshake:
      return "handshake";
    case TerminateCode::kAborted:
      return "aborted";
  }
  return "?";
}

std::vector<uint8_t> encode_terminate(const Terminate& m) {
  Writer w;
  w.u8(static_cast<uint8_t>(m.layer));
  w.u8(static_cast<uint8_t>(m.code));
  w.str8(std::string_view(m.reason).substr(0, 255));
  return std::move(w.buffer());
}

std::optional<Terminate> decode_terminate(std::span<const uint8_t> p) {
  Reader r(p);
  const uint8_t layer = r.u8(), code = r.u8();
  Terminate m{static_cast<TerminateLayer>(layer), static_cast<TerminateCode>(code), r.str8()};
  if (layer > uint8_t(TerminateLayer::kLlp) || code < uint8_t(TerminateCode::kProtocol) ||
      code > uint8_t(TerminateCode::kAborted)) {
    return std::nullopt;
  }
  return done(r, std::move(m));
}

SegmentHeader terminate_header(bool over_tcp, uint32_t msn) {
  SegmentHeader h;
  h.service = over_tcp ? Service::kRC : Service::kUD;
  h.opcode = Opcode::kTerminate;
  h.queue = kTerminateQueue;
  h.msn = msn;
  h.last = true;
  return h;
}

std::string describe(const Terminate& t) { return std::string(terminate_code_name(t.code)) + ": " + t.reason; }

}  // namespace slotstream::dgram
