#include "dgram/control.h"

#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

using wire::Reader;
using wire::Writer;

// Device lists are bounded by the u16 count and by the datagram they travel in.
inline constexpr size_t kMaxListed = 4096;

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

}  // namespace

std::vector<uint8_t> encode_control(const Hello& m) {
  Writer w = start(ControlType::kHello);
  w.str8(m.protocol);
  w.str8(m.name);
  w.u32(m.ring);
  w.u64(m.max_message);
  w.u32(m.segment_size);
  w.u16(static_cast<uint16_t>(m.devices.size()));
  for (uint16_t d : m.devices) w.u16(d);
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Accept& m) {
  Writer w = start(ControlType::kAccept);
  w.u32(m.receiver_qp);
  w.u32(m.credits);
  w.u64(m.region_length);
  w.u16(static_cast<uint16_t>(m.rings.size()));
  for (const auto& r : m.rings) {
    w.u16(r.device);
    w.u32(r.first_stag);
  }
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Refuse& m) {
  Writer w = start(ControlType::kRefuse);
  w.str8(m.reason.substr(0, 255));
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const Fin& m) {
  Writer w = start(ControlType::kFin);
  w.u16(static_cast<uint16_t>(m.devices.size()));
  for (const auto& d : m.devices) {
    w.u16(d.device);
    w.u64(d.messages);
    w.u64(d.bytes);
  }
  return std::move(w.buffer());
}

std::vector<uint8_t> encode_control(const FinAck& m) {
  Writer w = start(ControlType::kFinAck);
  w.u16(static_cast<uint16_t>(m.devices.size()));
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

std::optional<ControlType> control_type(std::span<const uint8_t> p) {
  if (p.empty() || p[0] < uint8_t(ControlType::kHello) || p[0] > uint8_t(ControlType::kFinAck)) return std::nullopt;
  return static_cast<ControlType>(p[0]);
}

std::optional<Hello> decode_hello(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kHello);
  if (!r) return std::nullopt;
  Hello m;
  m.protocol = r->str8();
  m.name = r->str8();
  m.ring = r->u32();
  m.max_message = r->u64();
  m.segment_size = r->u32();
  uint16_t n = r->u16();
  if (n > kMaxListed) return std::nullopt;
  for (uint16_t i = 0; i < n && r->ok(); ++i) m.devices.push_back(r->u16());
  return done(*r, std::move(m));
}

std::optional<Accept> decode_accept(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kAccept);
  if (!r) return std::nullopt;
  Accept m;
  m.receiver_qp = r->u32();
  m.credits = r->u32();
  m.region_length = r->u64();
  uint16_t n = r->u16();
  if (n > kMaxListed) return std::nullopt;
  for (uint16_t i = 0; i < n && r->ok(); ++i) {
    Accept::Ring ring;
    ring.device = r->u16();
    ring.first_stag = r->u32();
    m.rings.push_back(ring);
  }
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
  uint16_t n = r->u16();
  if (n > kMaxListed) return std::nullopt;
  for (uint16_t i = 0; i < n && r->ok(); ++i) {
    Fin::Device d;
    d.device = r->u16();
    d.messages = r->u64();
    d.bytes = r->u64();
    m.devices.push_back(d);
  }
  return done(*r, std::move(m));
}

std::optional<FinAck> decode_fin_ack(std::span<const uint8_t> p) {
  auto r = open(p, ControlType::kFinAck);
  if (!r) return std::nullopt;
  FinAck m;
  uint16_t n = r->u16();
  if (n > kMaxListed) return std::nullopt;
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

}  // namespace slotstream::dgram
