// In-order delivery (engine/ucx/stream/delivery.h) fed arbitrary record sequences through a fake
// ReceiverProtocol (blocks in memory, as tests/engine/ucx/stream/delivery_test.cc does): the input is a
// script of sender and receiver events, and a model of what the sender sent checks the result.
//
// Configuration (first bytes): blocks (1..16), payload capacity per block (0..48), declared
// devices (1..4), whether records span the whole block (block protocols) or exactly the unit
// (ring protocols), "lossy" — whether packets may be lost or made visible late — and room for
// packing (0..96 bytes more per block: packed units of several records, issue 21).
// Events: put a device's next fragment into a free block of the fuzzer's choice, put a packed
// unit of several devices' next records (with a void record now and then), a consumer pass, a
// duplicate of an earlier unit, a unit with one header bit flipped, a record for an undeclared
// device, a packet far beyond the reorder window or far behind it, sink failures (a full disk;
// with FUZZ_BUSY also a busy worker, which pauses that device alone), holding or releasing a
// block (set_blocked), a different poll order, and in lossy mode a lost packet or a packet that
// becomes visible only some passes later. Then everything is drained.
//
// Invariants (any violation aborts, so libFuzzer keeps the input):
//   - the sink sees begin / append... / commit-or-abort per device, never an append or commit
//     without a begin; a failing sink call has no effect;
//   - release() only on a record that is there and not yet released;
//   - every stored message is one the sender sent, intact, and per device in sending order with
//     none stored twice (a subsequence of what was sent);
//   - without loss: every message is stored, no gap or broken message is counted, and duplicates
//     (each record of a duplicated unit), bad headers (one per damaged unit), unknown devices and
//     out-of-window packets are counted exactly as injected (stale packets count as duplicates);
//   - with loss: gaps never exceed the packets lost or delayed;
//   - the counters agree with the sink (messages, bytes, per device) and every block drains.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "engine/ucx/stream/delivery.h"

namespace wire = slotstream::wire;
namespace protocol = slotstream::protocol;
using slotstream::Code;
using slotstream::Status;
using slotstream::stream::Delivery;

namespace {

// FUZZ_TRACE=1 in the environment: every event on stderr, to read a finding (fuzz/README.md).
const bool kTrace = std::getenv("FUZZ_TRACE") != nullptr;
// FUZZ_BUSY=1: the sink may also answer kBusy (per-device pause). Off by default: a paused device
// is retried after Delivery::kBusyRetry (100 ms) of real time, which would make such inputs ~1000x
// slower than the rest; run it as a campaign of its own (docs/hardening.md).
const bool kBusyMode = std::getenv("FUZZ_BUSY") != nullptr;
#define TRACE(...)                                 \
  do {                                             \
    if (kTrace) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

constexpr size_t kHeader = wire::kBlockHeaderSize;

// Blocks in memory with one status per block (0 free, 1 full), like status_byte's receiver.
class FakeBlocks : public protocol::ReceiverProtocol {
 public:
  FakeBlocks(uint32_t n, uint32_t block_size, bool exact)
      : block_size_(block_size),
        exact_(exact),
        data_(size_t(n) * block_size),
        full_(n, false),
        length_(n, 0) {}
  std::vector<uint8_t> setup() const override { return {}; }
  void poll(std::vector<protocol::Record>* out) override {
    const uint32_t n = uint32_t(full_.size());
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t i = (k + rotation) % n;
      if (full_[i])
        out->push_back({i, i, std::span(data_.data() + size_t(i) * block_size_, exact_ ? length_[i] : block_size_)});
    }
  }
  void release(uint64_t id) override {
    FUZZ_CHECK(id < full_.size());
    FUZZ_CHECK(full_[id]);  // never released twice, never one that is not there
    full_[id] = false;
  }
  uint64_t max_records() const override { return full_.size(); }

  std::vector<uint32_t> free_slots() const {
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < full_.size(); ++i) {
      if (!full_[i]) out.push_back(i);
    }
    return out;
  }
  bool empty() const {
    return std::none_of(full_.begin(), full_.end(), [](bool f) { return f; });
  }
  void put(uint32_t slot, const std::vector<std::byte>& record) {
    FUZZ_CHECK(!full_[slot] && record.size() <= block_size_);
    std::memcpy(data_.data() + size_t(slot) * block_size_, record.data(), record.size());
    length_[slot] = uint32_t(record.size());
    full_[slot] = true;
  }
  uint32_t rotation = 0;

 private:
  uint32_t block_size_;
  bool exact_;
  std::vector<std::byte> data_;
  std::vector<bool> full_;
  std::vector<uint32_t> length_;
};

// Checks the MessageSink contract and can fail like a full disk (a failed call has no effect).
class CheckingSink : public slotstream::MessageSink {
 public:
  Status begin(uint16_t d) override {
    FUZZ_CHECK(!open_[d]);  // Delivery aborts an unfinished message before it begins the next
    if (busy_next > 0) {
      --busy_next;
      TRACE("sink: device %u busy\n", d);
      return {Code::kBusy, "worker behind"};  // pauses this device alone
    }
    if (failing()) return {Code::kIoError, "disk full"};
    open_[d] = true;
    current_[d].clear();
    return Status::ok();
  }
  Status append(uint16_t d, std::span<const std::byte> data) override {
    FUZZ_CHECK(open_[d]);
    if (failing()) return {Code::kIoError, "disk full"};
    current_[d].append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::ok();
  }
  Status commit(uint16_t d) override {
    FUZZ_CHECK(open_[d]);
    if (failing()) return {Code::kIoError, "disk full"};
    stored[d].push_back(current_[d]);
    TRACE("sink: device %u message %zu stored (%zu bytes)\n", d, stored[d].size() - 1, current_[d].size());
    open_[d] = false;
    return Status::ok();
  }
  void abort(uint16_t d) override {
    TRACE("sink: device %u message aborted\n", d);
    FUZZ_CHECK(open_[d]);
    open_[d] = false;
    current_[d].clear();
  }
  bool any_open() const {
    return std::any_of(open_.begin(), open_.end(), [](const auto& kv) { return kv.second; });
  }
  int fail_next = 0;
  int busy_next = 0;  // begin() answers kBusy (a worker behind), only with FUZZ_BUSY set
  std::map<uint16_t, std::vector<std::string>> stored;

 private:
  bool failing() {
    if (fail_next <= 0) return false;
    --fail_next;
    return true;
  }
  std::map<uint16_t, bool> open_;
  std::map<uint16_t, std::string> current_;
};

// What the sender sent, one device at a time: messages cut into fragments of the fuzzer's sizes,
// each byte a function of (device, message, position) so that splices and mix-ups show.
struct DeviceModel {
  uint16_t id = 0;
  uint32_t next_packet = 0;
  std::vector<std::string> sent;  // every message begun, in order (complete once fragments run out)
  uint32_t fragments_left = 0;    // of the message being sent
  uint32_t fragment = 0;          // index of its next fragment
  uint32_t offset = 0;            // bytes of it sent so far
};

std::vector<std::byte> make_record(const wire::BlockHeader& h, std::string_view payload) {
  std::vector<std::byte> r(kHeader + payload.size());
  wire::encode_block_header(h, std::span(r).first<kHeader>());
  std::memcpy(r.data() + kHeader, payload.data(), payload.size());
  return r;
}

// Several records behind a packed header, each padded to 8 bytes (wire/block_header.h).
std::vector<std::byte> make_unit(const std::vector<std::vector<std::byte>>& records) {
  std::vector<std::byte> u(wire::kPackedHeaderSize);
  for (const auto& r : records) {
    const size_t at = u.size();
    u.resize(at + wire::packed_record_size(r.size() - kHeader), std::byte{0x5C});
    std::memcpy(u.data() + at, r.data(), r.size());
  }
  wire::encode_packed_header({uint32_t(records.size()), uint32_t(u.size())},
                             std::span(u).first<wire::kPackedHeaderSize>());
  return u;
}

// What was put into a block: its bytes and how many real records (messages' packets) it holds.
struct Unit {
  std::vector<std::byte> bytes;
  uint32_t records = 1;
};

char content(uint16_t device, size_t message, size_t pos) {
  uint64_t x = (uint64_t(device) << 48) ^ (uint64_t(message) << 20) ^ pos;
  x *= 0x9E3779B97F4A7C15ull;
  return char(x >> 56);
}

class Run {
 public:
  explicit Run(FuzzedDataProvider& in) : in_(in) {
    const uint32_t blocks = in_.ConsumeIntegralInRange<uint32_t>(1, 16);
    capacity_ = in_.ConsumeIntegralInRange<uint32_t>(0, 48);
    const bool exact = in_.ConsumeBool();
    lossy_ = in_.ConsumeBool();
    const int n_devices = in_.ConsumeIntegralInRange<int>(1, 4);
    pack_room_ = in_.ConsumeIntegralInRange<uint32_t>(0, 96);
    std::vector<uint16_t> ids;
    for (int i = 0; i < n_devices; ++i) {
      uint16_t id = in_.ConsumeIntegral<uint16_t>();
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    for (uint16_t id : ids) devices_.push_back(DeviceModel{.id = id});
    block_size_ = uint32_t(kHeader + capacity_ + pack_room_);
    blocks_ = std::make_unique<FakeBlocks>(blocks, block_size_, exact);
    delivery_ = std::make_unique<Delivery>(*blocks_, sink_, ids, pack_room_ ? block_size_ : 0);
    TRACE("%u blocks, capacity %u, %s records, %s, %zu devices\n", blocks, capacity_, exact ? "exact" : "block",
          lossy_ ? "lossy" : "lossless", ids.size());
  }

  void play() {
    for (int step = 0; step < 3000 && in_.remaining_bytes() > 0; ++step) {
      switch (in_.ConsumeIntegralInRange<int>(0, lossy_ ? 12 : 10)) {
        case 0:
        case 1:
          put_next(pick_device(), Fate::kVisible);
          break;
        case 2:
          pass();
          break;
        case 3:
          duplicate();
          break;
        case 4:
          corrupt();
          break;
        case 5:
          unknown_device();
          break;
        case 6:
          far_packet();
          break;
        case 7:
          if (kBusyMode && in_.ConsumeBool()) {
            sink_.busy_next = in_.ConsumeIntegralInRange<int>(0, 3);
          } else {
            sink_.fail_next = in_.ConsumeIntegralInRange<int>(0, 3);
          }
          break;
        case 8:
          hold();
          break;
        case 9:
          blocks_->rotation = in_.ConsumeIntegral<uint8_t>();
          break;
        case 10:
          put_packed();
          break;
        case 11:
          put_next(pick_device(), Fate::kLost);
          break;
        case 12:
          put_next(pick_device(), Fate::kLate);
          break;
      }
    }
    drain();
    check();
  }

 private:
  enum class Fate { kVisible, kLost, kLate };
  struct Late {
    std::vector<std::byte> record;
    int passes;  // visible after this many more passes
  };

  DeviceModel& pick_device() { return devices_[in_.ConsumeIntegralInRange<size_t>(0, devices_.size() - 1)]; }

  // A free block of the fuzzer's choice, or none (the sender would wait).
  std::optional<uint32_t> free_slot() {
    auto slots = blocks_->free_slots();
    if (slots.empty()) return std::nullopt;
    return slots[in_.ConsumeIntegralInRange<size_t>(0, slots.size() - 1)];
  }

  void put(const std::vector<std::byte>& unit) {
    auto slot = free_slot();
    FUZZ_CHECK(slot.has_value());
    blocks_->put(*slot, unit);
    if (!kTrace) return;
    wire::UnitReader reader(unit);
    for (wire::UnitReader::Item it; reader.next(&it);) {
      TRACE("put slot %u: device %u packet %u flags %u length %u%s\n", *slot, it.header.device, it.header.packet,
            it.header.flags, it.header.payload_length, reader.packed() ? " (packed)" : "");
    }
    if (reader.bad()) TRACE("put slot %u: bad unit\n", *slot);
  }

  // 2..4 devices' next records (and now and then a void one) behind a packed header, when they
  // fit in a block; else each in a block of its own (in order, as the sender's ring would).
  void put_packed() {
    if (blocks_->free_slots().empty() || !waiting_.empty()) return;  // the sender waits for a block
    std::vector<std::vector<std::byte>> records;
    uint32_t real = 0;
    size_t bytes = wire::kPackedHeaderSize;
    const int n = in_.ConsumeIntegralInRange<int>(2, 4);
    for (int k = 0; k < n; ++k) {
      std::vector<std::byte> r;
      if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
        const uint32_t len = in_.ConsumeIntegralInRange<uint32_t>(0, 8);
        r = make_record({wire::kVoid, in_.ConsumeIntegral<uint16_t>(), 0, len}, std::string(len, 'v'));
      } else {
        DeviceModel& d = pick_device();
        if (d.fragments_left == 0) start_message(d);
        r = next_fragment(d, in_.ConsumeIntegralInRange<uint32_t>(0, std::min<uint32_t>(capacity_, 16)));
        ++real;
      }
      bytes += wire::packed_record_size(r.size() - kHeader);
      records.push_back(std::move(r));
    }
    if (bytes <= block_size_) {
      Unit u{make_unit(records), real};
      put(u.bytes);
      history_.push_back(std::move(u));
      return;
    }
    for (auto& r : records) {  // too large to pack here: a block each (void ones are dropped)
      if (std::to_integer<uint8_t>(r[1]) & wire::kVoid) continue;
      waiting_.push_back(std::move(r));
    }
    place_waiting();
  }

  // Records that waited for a block get one, in their order.
  void place_waiting() {
    while (!waiting_.empty() && !blocks_->free_slots().empty()) {
      put(waiting_.front());
      history_.push_back(Unit{waiting_.front()});
      waiting_.pop_front();
    }
  }

  // The device's next fragment (a new message when the last one is complete).
  void put_next(DeviceModel& d, Fate fate) {
    // The sender waits behind records still waiting for a block, whatever becomes of its next
    // packet: it writes each device's packets in order, so a lost or late packet cannot be
    // produced ahead of earlier ones still unwritten (the receiver would rightly count those as a
    // gap the model never lost). A visible packet also waits for a free block.
    if (!waiting_.empty() || (fate == Fate::kVisible && blocks_->free_slots().empty())) return;
    if (d.fragments_left == 0) start_message(d);
    auto record = next_fragment(d, in_.ConsumeIntegralInRange<uint32_t>(0, capacity_));
    switch (fate) {
      case Fate::kVisible:
        put(record);
        history_.push_back(Unit{record});
        break;
      case Fate::kLost:
        ++lost_;
        break;
      case Fate::kLate:
        late_.push_back({record, in_.ConsumeIntegralInRange<int>(1, 4)});
        ++lost_;
        break;
    }
  }

  void start_message(DeviceModel& d) {
    d.fragments_left = in_.ConsumeIntegralInRange<uint32_t>(1, 4);
    d.fragment = 0;
    d.offset = 0;
    d.sent.emplace_back();
  }

  void pass() {
    place_waiting();
    size_t consumed = 0;
    Status st = delivery_->pass(&consumed);
    TRACE("pass: %zu consumed, %s\n", consumed, st.to_string().c_str());
    // Only the sink's own errors come back.
    FUZZ_CHECK(st.is_ok() || st.code() == Code::kIoError || (kBusyMode && st.code() == Code::kBusy));
    // Late packets land now, if there is room (otherwise they wait longer).
    for (auto it = late_.begin(); it != late_.end();) {
      if (--it->passes <= 0 && !blocks_->free_slots().empty()) {
        put(it->record);
        it = late_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // An earlier unit again: each of its records is a duplicate.
  void duplicate() {
    if (history_.empty() || blocks_->free_slots().empty()) return;
    const Unit& u = history_[in_.ConsumeIntegralInRange<size_t>(0, history_.size() - 1)];
    put(u.bytes);
    injected_duplicates_ += u.records;
  }

  // One bit of a real unit's first header flipped (a record's, or a packed unit's): the check
  // word catches every single-bit error, and the whole unit counts as one bad header.
  void corrupt() {
    if (history_.empty() || blocks_->free_slots().empty()) return;
    auto unit = history_[in_.ConsumeIntegralInRange<size_t>(0, history_.size() - 1)].bytes;
    const uint32_t bit = in_.ConsumeIntegralInRange<uint32_t>(0, kHeader * 8 - 1);
    unit[bit / 8] ^= std::byte(1u << (bit % 8));
    put(unit);
    ++injected_bad_;
  }

  void unknown_device() {
    if (blocks_->free_slots().empty()) return;
    uint16_t id = in_.ConsumeIntegral<uint16_t>();
    if (std::any_of(devices_.begin(), devices_.end(), [&](const DeviceModel& d) { return d.id == id; })) return;
    std::string payload = in_.ConsumeBytesAsString(in_.ConsumeIntegralInRange<uint32_t>(0, capacity_));
    put(make_record(
        {wire::kFirstFragment | wire::kLastFragment, id, in_.ConsumeIntegral<uint32_t>(), uint32_t(payload.size())},
        payload));
    ++injected_unknown_;
  }

  // A packet number far outside the reorder window: 2^30 ahead of anything this run sends (a
  // packet only one window ahead is not "far": the window moves with the sender, and a forged
  // packet inside it is indistinguishable from a real one), or as far behind (stale: counted as a
  // duplicate).
  void far_packet() {
    if (blocks_->free_slots().empty()) return;
    DeviceModel& d = pick_device();
    const bool ahead = in_.ConsumeBool();
    const uint32_t distance = (1u << 30) + in_.ConsumeIntegralInRange<uint32_t>(0, 1u << 20);
    std::string payload = in_.ConsumeBytesAsString(in_.ConsumeIntegralInRange<uint32_t>(0, capacity_));
    put(make_record({wire::kFirstFragment | wire::kLastFragment, d.id,
                     ahead ? d.next_packet + distance : d.next_packet - distance, uint32_t(payload.size())},
                    payload));
    ++(ahead ? injected_far_ : injected_stale_);
  }

  void hold() {
    const uint32_t slot = in_.ConsumeIntegralInRange<uint32_t>(0, uint32_t(blocks_->max_records() - 1));
    const bool held = in_.ConsumeBool();
    delivery_->set_blocked(slot, held);
    if (held)
      held_.insert(slot);
    else
      held_.erase(slot);
  }

  // The sender finishes its open messages, the receiver frees its holds and the disk its space;
  // then every block must drain.
  void drain() {
    for (uint32_t slot : held_) delivery_->set_blocked(slot, false);
    held_.clear();
    sink_.fail_next = 0;
    sink_.busy_next = 0;
    for (int i = 0; i < 100000; ++i) {
      place_waiting();
      bool sending = !waiting_.empty();
      for (DeviceModel& d : devices_) {
        if (d.fragments_left == 0) continue;
        sending = true;
        if (waiting_.empty() && !blocks_->free_slots().empty()) put_final_fragment(d);
      }
      // A paused device is tried again only after Delivery::kBusyRetry of real time.
      if (delivery_->any_paused()) std::this_thread::sleep_for(Delivery::kBusyRetry / 10);
      // A paused device's records may be copied aside (out of the blocks): it must resume first.
      if (!sending && late_.empty() && blocks_->empty() && !delivery_->any_paused() && i > 3) {
        pass();
        pass();
        pass();
        FUZZ_CHECK(blocks_->empty());
        return;
      }
      pass();
    }
    FUZZ_CHECK(!"delivery never drained");
  }

  // The record of the device's next fragment, `length` payload bytes, recorded as sent.
  std::vector<std::byte> next_fragment(DeviceModel& d, uint32_t length) {
    std::string payload;
    for (uint32_t i = 0; i < length; ++i) payload += content(d.id, d.sent.size() - 1, d.offset + i);
    d.sent.back() += payload;
    uint8_t flags = 0;
    if (d.fragment++ == 0) flags |= wire::kFirstFragment;
    if (--d.fragments_left == 0) flags |= wire::kLastFragment;
    d.offset += length;
    return make_record({flags, d.id, d.next_packet++, length}, payload);
  }

  // Like put_next, without consuming input (the input may have run out).
  void put_final_fragment(DeviceModel& d) {
    auto record = next_fragment(d, std::min<uint32_t>(capacity_, 3));
    put(record);
    history_.push_back(Unit{std::move(record)});
  }

  void check() {
    const auto& c = delivery_->counters();
    const auto per_device = delivery_->per_device();
    uint64_t messages = 0, bytes = 0;
    for (const DeviceModel& d : devices_) {
      const auto& stored = sink_.stored[d.id];
      // Stored messages are a subsequence of the sent ones, each intact.
      size_t j = 0;
      uint64_t device_bytes = 0;
      for (const std::string& m : stored) {
        while (j < d.sent.size() && d.sent[j] != m) ++j;
        FUZZ_CHECK(j < d.sent.size());  // stored something never sent, out of order, or twice
        ++j;
        device_bytes += m.size();
      }
      if (!lossy_ && stored != d.sent) {
        TRACE("device %u: %zu of %zu messages stored\n", d.id, stored.size(), d.sent.size());
      }
      if (!lossy_) FUZZ_CHECK(stored == d.sent);
      FUZZ_CHECK(delivery_->messages(d.id) == stored.size());
      FUZZ_CHECK(per_device.at(d.id).messages == stored.size());
      FUZZ_CHECK(per_device.at(d.id).bytes == device_bytes);
      messages += stored.size();
      bytes += device_bytes;
    }
    FUZZ_CHECK(sink_.stored.size() == devices_.size());  // nothing for undeclared devices
    FUZZ_CHECK(c.messages == messages && c.bytes == bytes);
    FUZZ_CHECK(c.gaps <= lost_);
    FUZZ_CHECK(c.bad_headers == injected_bad_);
    FUZZ_CHECK(c.unknown_device == injected_unknown_);
    if (!lossy_) {
      FUZZ_CHECK(c.gaps == 0 && c.broken_messages == 0);
      FUZZ_CHECK(c.duplicates == injected_duplicates_ + injected_stale_);
      FUZZ_CHECK(c.out_of_window == injected_far_);
    }
    delivery_->abort_partials();
    FUZZ_CHECK(!delivery_->has_open_message() && !sink_.any_open());
  }

  FuzzedDataProvider& in_;
  uint32_t capacity_ = 0;
  bool lossy_ = false;
  std::vector<DeviceModel> devices_;
  CheckingSink sink_;
  std::unique_ptr<FakeBlocks> blocks_;
  std::unique_ptr<Delivery> delivery_;
  uint32_t pack_room_ = 0;
  uint32_t block_size_ = 0;
  std::vector<Unit> history_;                   // every real unit the sender made
  std::deque<std::vector<std::byte>> waiting_;  // records waiting for a block (in sending order)
  std::deque<Late> late_;
  std::set<uint32_t> held_;
  uint64_t lost_ = 0;
  uint64_t injected_duplicates_ = 0, injected_bad_ = 0, injected_unknown_ = 0, injected_far_ = 0, injected_stale_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Run(in).play();
  return 0;
}
