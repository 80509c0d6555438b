// libFuzzer target: the datagram receiver's session and placement code (src/engine/dgram/recv/session.h and what it
// drives: handshake.h's check_hello, tagged.h, recv_queue.h, placement.h, device_order.h, rd.h) — everything
// a sender controls once its HELLO is accepted, without sockets. The input is a script: a HELLO (protocol,
// up to 4,096 devices, ring, largest message), then events — segments of the session's protocol (Write-
// Record, Send, RDMA Write and its notification; in and out of order, duplicated with other bytes, past
// regions and rings, far ahead, stale), raw datagrams resealed with a right CRC, RD sequences and probes,
// FIN parts (also wrong ones and counts up to 2^64 - 1), back-pressure on and off, RD acks, time passing
// and hand-overs to a store of limited room.
//
// Invariants on every input, beyond "no crash, no UB, no leak":
//   - check_hello accepts the HELLO the script built (it is within the limits used), and the session
//     allocates nothing per device or STag until data comes: state only for devices that carried data or
//     were in a FIN, records only for STags written to (at most devices x ring);
//   - hand-over is in order: per device, MSNs strictly increase; a complete message is as long as it
//     says; a partial one only from Write-Record with keep_partial; nothing past the store's room from an
//     unreliable session;
//   - a device's report counts exactly the messages handed over (complete + partial);
//   - once every message is accounted for, each device announced by FIN with c messages has at least c
//     of them counted (complete + partial + dropped + lost), and the FIN_ACK parts say the same;
//   - no busy wait: after a hand-over at time t, the session's next deadline is later than t.
// Build and run: bash fuzz/run.sh dgram_session (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "check.h"
#include "engine/dgram/recv/handshake.h"
#include "engine/dgram/recv/session.h"
#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/crc32c.h"
#include "engine/dgram/wire/wire.h"

using namespace slotstream::dgram;

namespace {

constexpr int64_t kMs = 1'000'000;

class Script {
 public:
  explicit Script(std::span<const uint8_t> in) : in_(in) {}
  bool more() const { return pos_ < in_.size(); }
  uint8_t u8() { return pos_ < in_.size() ? in_[pos_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | u8() << 8); }
  uint32_t u32() { return uint32_t(u16() | uint32_t(u16()) << 16); }
  uint64_t u64() { return u32() | uint64_t(u32()) << 32; }
  std::vector<std::byte> bytes(size_t n) {
    std::vector<std::byte> b;
    for (size_t i = 0; i < n && more(); ++i) b.push_back(std::byte(u8()));
    return b;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

struct Run {
  Session* s = nullptr;
  int64_t now = 0;
  bool keep_partial = false;
  bool backpressure = false;
  std::map<uint16_t, int64_t> last_msn;  // per device: the last MSN handed over
  std::map<uint16_t, uint64_t> handed;   // per device: complete + partial handed over
  std::map<uint16_t, uint64_t> fin;      // per device: the count its accepted FIN part said
};

Hello make_hello(Script& in) {
  static const char* const kProtocols[] = {"write_record", "dgram_send", "dgram_rd", "rd_write_record", "dgram_rc"};
  Hello h;
  h.protocol = kProtocols[in.u8() % std::size(kProtocols)];
  h.name = "fuzz";
  const uint8_t shape = in.u8();
  const size_t n = shape & 0x80 ? 1 + in.u16() % kMaxHelloDevices : 1 + shape % 6;
  for (size_t i = 0; i < n; ++i) h.devices.push_back(uint16_t(i * 7 + shape % 3));
  h.ring = 1 + in.u8() % 4;
  h.max_message = in.u16() % 4097;
  h.segment_size = 64;
  return h;
}

// A segment the session's protocol uses, its fields from the script (mostly near the real ranges).
SegmentHeader make_segment(Script& in, const Session& s) {
  const Hello& h = s.hello();
  SegmentHeader g;
  g.service = s.protocol().service;  // (dgram_rc: RC, over its TCP stream)
  if (in.u8() % 16 == 0) g.service = Service(in.u8() % 3);
  const uint8_t kind = in.u8();
  g.opcode = kind % 3 == 0 ? Opcode::kSend : s.protocol().data_op;
  g.last = kind & 0x10;
  const uint16_t d = uint16_t(in.u8() % (h.devices.size() + 1));
  const uint16_t device = d < h.devices.size() ? h.devices[d] : in.u16();
  const uint32_t msn = kind & 0x40 ? in.u32() : in.u8() % 12;
  if (is_tagged(g.opcode)) {
    g.stag = kind & 0x20 ? in.u32() : 1 + uint32_t(d * h.ring + msn % h.ring);
    g.has_msn = g.opcode == Opcode::kWriteRecord;
    g.msn = g.has_msn ? msn : 0;
    g.offset = kind & 0x80 ? in.u64() : in.u16() % (h.max_message + 64);
  } else {
    g.queue = device;
    g.msn = msn;
    g.offset = kind & 0x80 ? in.u32() : in.u16() % (h.max_message + 64);
  }
  if (g.service == Service::kRD) g.rd = RdFields{in.u8() % 16 == 0 ? in.u32() : in.u8() % 40u, 0, 0, kRdSeqValid, 0};
  return g;
}

void feed(Run& r, const SegmentHeader& g, std::span<const std::byte> payload) {
  std::vector<std::byte> d(kMaxHeaderSize + payload.size() + kMaxTrailerSize);
  d.resize(encode_segment(g, payload, d));
  if (auto seg = decode_segment(d)) r.s->on_segment(*seg, d, r.now);
}

// A datagram of the script's own bytes, resealed with its CRC32C so the checks behind it are reached.
void feed_raw(Run& r, Script& in) {
  auto d = in.bytes(in.u8() % 96);
  if (d.size() < kCrcSize) return;
  const uint32_t crc = crc32c(std::span(d).first(d.size() - kCrcSize));
  for (size_t i = 0; i < kCrcSize; ++i) d[d.size() - kCrcSize + i] = std::byte(crc >> (8 * i));
  auto seg = decode_segment(d);
  if (seg && !(seg->header.opcode == Opcode::kSend && seg->header.queue == kControlQueue)) {
    r.s->on_segment(*seg, d, r.now);
  }
}

void fin(Run& r, Script& in) {
  const auto& devs = r.s->hello().devices;
  Fin f;
  f.total = in.u8() % 16 == 0 ? in.u16() : uint16_t(devs.size());
  f.first = uint16_t(in.u8() % ((devs.size() + kFinPartDevices - 1) / kFinPartDevices) * kFinPartDevices);
  const uint8_t how = in.u8();
  for (size_t i = f.first; i < devs.size() && i < f.first + kFinPartDevices; ++i) {
    const uint64_t count = how & 1 ? in.u64() : in.u8() % 16;
    f.devices.push_back({how & 2 ? uint16_t(devs[i] + 1) : devs[i], count, count * 10});
  }
  if (r.s->on_fin(f, r.now)) {
    for (const auto& d : f.devices) r.fin.try_emplace(d.device, d.messages);  // a repeated part changes nothing
  }
}

void release(Run& r, uint64_t room) {
  std::vector<Session::Ready> out;
  const uint64_t room0 = room;
  Session::Room rm{room, nullptr};
  r.s->release(r.now, rm, &out);
  uint64_t taken = 0;
  for (const auto& m : out) {
    auto [it, fresh] = r.last_msn.try_emplace(m.device, -1);
    FUZZ_CHECK(int64_t(m.msn) > it->second);
    it->second = m.msn;
    FUZZ_CHECK(m.completion.data.size() == m.completion.length);
    if (m.partial) FUZZ_CHECK(r.keep_partial && r.s->protocol().data_op == Opcode::kWriteRecord);
    if (!m.partial) FUZZ_CHECK(m.completion.outcome == Outcome::kComplete);
    ++r.handed[m.device];
    taken += m.completion.data.size();
  }
  if (!r.s->reliable()) FUZZ_CHECK(taken <= room0);
  // No busy wait: whatever was due at `now` has been acted upon.
  FUZZ_CHECK(r.s->next_deadline() > r.now);
}

void check_accounts(const Run& r, bool finished) {
  const Hello& h = r.s->hello();
  FUZZ_CHECK(r.s->devices_with_state() <= h.devices.size());
  FUZZ_CHECK(r.s->stags_touched() <= h.devices.size() * h.ring);
  const auto reports = r.s->device_accounts();
  for (const auto& [d, rep] : reports) {
    const auto it = r.handed.find(d);
    FUZZ_CHECK(rep.complete + rep.partial == (it == r.handed.end() ? 0 : it->second));
  }
  if (!r.s->all_released()) return;
  for (const auto& [d, count] : r.fin) {
    const auto it = reports.find(d);
    const uint64_t counted =
        it == reports.end() ? 0 : it->second.complete + it->second.partial + it->second.dropped + it->second.lost;
    FUZZ_CHECK(counted >= count);
  }
  if (!finished) return;  // (the parts of a 4,096-device session are too slow to build at every step)
  for (const FinAck& part : r.s->fin_ack_parts()) {
    for (const auto& d : part.devices) {
      const auto it = reports.find(d.device);
      FUZZ_CHECK((it == reports.end() ? 0 : it->second.lost) == d.counts.lost);
    }
  }
}

void step(Run& r, Script& in) {
  switch (in.u8() % 10) {
    case 0:
    case 1:
    case 2: {
      const SegmentHeader g = make_segment(in, *r.s);
      feed(r, g, in.bytes(in.u8() % 80));
      break;
    }
    case 3: {  // the same segment twice, the second with other bytes
      const SegmentHeader g = make_segment(in, *r.s);
      auto p = in.bytes(in.u8() % 80);
      feed(r, g, p);
      for (auto& b : p) b ^= std::byte{0x5A};
      feed(r, g, p);
      break;
    }
    case 4:
      feed_raw(r, in);
      break;
    case 5:
      fin(r, in);
      break;
    case 6:
      r.backpressure = !r.backpressure;
      r.s->set_backpressure(r.backpressure, r.now);
      break;
    case 7: {
      if (auto ack = r.s->take_ack()) FUZZ_CHECK(r.s->protocol().service == Service::kRD);
      SegmentHeader probe;
      probe.service = Service::kRD;
      probe.opcode = Opcode::kAck;
      probe.rd.flags = kRdProbe;
      feed(r, probe, {});
      break;
    }
    case 8: {
      const uint8_t t = in.u8();
      r.now += t < 200 ? int64_t(t) * kMs : int64_t(in.u16()) * 100 * kMs;
      break;
    }
    case 9:
      (void)in.u8();  // (was: keep_partial per release; now the session's, Session::Config)
      release(r, in.u8() % 4 == 0 ? in.u16() : UINT64_MAX);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Script in({data, size});
  const Hello hello = make_hello(in);
  HelloLimits limits;
  limits.over_tcp = hello.protocol == "dgram_rc";
  HelloTerms terms;
  const auto refusal = check_hello(hello, limits, &terms);
  FUZZ_CHECK(!refusal);
  Session::Config c;
  c.protocol = terms.protocol;
  c.hello = hello;
  c.message_timeout_ns = 200 * kMs;
  c.reliable_timeout_ns = 1000 * kMs;
  c.rd_window = 32;
  c.keep_partial = in.u8() & 1;
  const bool keep_partial = c.keep_partial;
  Session s(std::move(c));
  FUZZ_CHECK(s.devices_with_state() == 0 && s.stags_touched() == 0);
  Run r;
  r.s = &s;
  r.keep_partial = keep_partial;
  for (int events = 0; in.more() && events < 400; ++events) {
    step(r, in);
    check_accounts(r, false);
  }
  release(r, UINT64_MAX);
  check_accounts(r, true);
  return 0;
}
