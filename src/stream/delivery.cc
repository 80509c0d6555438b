#include "stream/delivery.h"

#include <algorithm>

#include "stream/trace.h"

namespace slotstream::stream {

Delivery::Delivery(protocol::ReceiverProtocol& proto, MessageSink& sink, const std::vector<uint16_t>& devices)
    : proto_(proto),
      sink_(sink) {
  for (uint16_t d : devices) devices_[d];
}

Status Delivery::apply(const Entry& e, Stage stage) {
  const wire::BlockHeader& h = e.header;
  DeviceState& dev = devices_[h.device];
  auto payload = e.record.bytes.subspan(wire::kBlockHeaderSize, h.payload_length);
  auto fail = [&](Status st, Stage at) {
    pending_ = Pending{e, at};
    return st;
  };
  if (stage == Stage::kBegin) {
    if (h.first()) {
      if (!dev.taken_up) dev.taken_up = pass_now_;  // kept while the sink is busy: waits count
      if (dev.open) {                               // the previous message never got its last fragment
        sink_.abort(h.device);
        dev.taken_up = pass_now_;
        dev.open = false;
        ++counters_.broken_messages;
      }
      if (Status st = sink_.begin(h.device); !st.is_ok()) return fail(st, Stage::kBegin);
      dev.open = true;
      dev.open_bytes = 0;
    } else if (!dev.open) {
      ++counters_.broken_messages;  // a tail fragment whose message start was lost
      return Status::ok();
    }
    stage = Stage::kAppend;
  }
  if (stage == Stage::kAppend) {
    if (Status st = sink_.append(h.device, payload); !st.is_ok()) return fail(st, Stage::kAppend);
    dev.open_bytes += payload.size();
    stage = Stage::kCommit;
  }
  if (h.last()) {
    if (Status st = sink_.commit(h.device); !st.is_ok()) return fail(st, Stage::kCommit);
    trace(TraceStage::kDelivered, h.device, h.packet);
    if (dev.taken_up) {
      counters_.store_latency.observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *dev.taken_up).count());
    }
    dev.taken_up.reset();
    dev.open = false;
    ++dev.counters.messages;
    dev.counters.bytes += dev.open_bytes;
    ++counters_.messages;
    counters_.bytes += dev.open_bytes;
  }
  return Status::ok();
}

Status Delivery::pass(size_t* consumed, std::chrono::steady_clock::time_point now) {
  *consumed = 0;
  pass_now_ = now;
  auto deliver = [&](const Entry& e, Stage stage) -> Status {
    SLOTSTREAM_RETURN_IF_ERROR(apply(e, stage));
    proto_.release(e.record.id);
    ++devices_[e.header.device].expected;
    ++*consumed;
    return Status::ok();
  };
  if (pending_) {
    Pending p = *pending_;
    pending_.reset();
    SLOTSTREAM_RETURN_IF_ERROR(deliver(p.entry, p.stage));
  }

  records_.clear();
  proto_.poll(&records_);
  entries_.clear();
  uint64_t held = 0, useful = 0;
  for (const protocol::Record& rec : records_) {
    held += rec.bytes.size();
    if (!blocked_.empty()) {
      auto b = blocked_.find(rec.slot);
      if (b != blocked_.end() && b->second) continue;
    }
    std::optional<wire::BlockHeader> h;
    if (rec.bytes.size() >= wire::kBlockHeaderSize) {
      h = wire::decode_block_header(rec.bytes.first<wire::kBlockHeaderSize>(),
                                    rec.bytes.size() - wire::kBlockHeaderSize);
    }
    if (!h) {
      ++counters_.bad_headers;
      proto_.release(rec.id);
      ++*consumed;
    } else if (!devices_.contains(h->device)) {
      ++counters_.unknown_device;  // counted, never written as data
      proto_.release(rec.id);
      ++*consumed;
    } else {
      trace(TraceStage::kPolled, h->device, h->packet);
      entries_.push_back({rec, *h});
      useful += h->payload_length;
    }
  }
  if (last_pass_) {
    const double dt = double(std::chrono::duration_cast<std::chrono::nanoseconds>(now - *last_pass_).count());
    counters_.buffer_held_byte_ns += double(last_held_) * dt;
    counters_.buffer_useful_byte_ns += double(last_useful_) * dt;
    counters_.buffer_observed_ns += dt;
  }
  last_pass_ = now;
  last_held_ = held;
  last_useful_ = useful;
  // Per device, nearest packet first: consecutive packets then deliver in one pass.
  std::sort(entries_.begin(), entries_.end(), [&](const Entry& a, const Entry& b) {
    if (a.header.device != b.header.device) return a.header.device < b.header.device;
    uint32_t exp = devices_[a.header.device].expected;
    return wire::packet_distance(exp, a.header.packet) < wire::packet_distance(exp, b.header.packet);
  });

  if (pass_interrupted_) {  // the last pass returned an error half-way: forget its marks
    for (auto& [d, dev] : devices_) {
      dev.pass_progressed = false;
      dev.pass_waiting = -1;
    }
  }
  pass_interrupted_ = true;
  const auto window = static_cast<int64_t>(Delivery::window(proto_.max_records()));
  for (const Entry& e : entries_) {
    DeviceState& dev = devices_[e.header.device];
    int64_t dist = wire::packet_distance(dev.expected, e.header.packet);
    if (dist < 0) {
      ++counters_.duplicates;
      ++dev.counters.duplicates;
      proto_.release(e.record.id);
      ++*consumed;
    } else if (dist >= window) {
      ++counters_.out_of_window;
      proto_.release(e.record.id);
      ++*consumed;
    } else if (dist == 0) {
      if (dev.counters.paused && now < dev.retry_at) continue;  // its records wait in place
      Status st = deliver(e, Stage::kBegin);
      if (st.code() == Code::kBusy && pending_ && pending_->stage == Stage::kBegin) {
        // Nothing of this message was started: pause the device, not the pass.
        pending_.reset();
        dev.retry_at = now + kBusyRetry;
        if (!dev.counters.paused) {
          dev.counters.paused = true;
          ++dev.counters.pauses;
          if (on_pause_) on_pause_(e.header.device, true);
        }
        continue;
      }
      SLOTSTREAM_RETURN_IF_ERROR(st);
      if (dev.counters.paused) {
        dev.counters.paused = false;
        if (on_pause_) on_pause_(e.header.device, false);
      }
      dev.pass_progressed = true;
    } else if (dev.pass_waiting < 0) {
      dev.pass_waiting = dist;  // entries are sorted: the nearest first
    }
  }
  for (auto& [d, dev] : devices_) {
    const bool progressed = dev.pass_progressed;
    const int64_t waiting = dev.pass_waiting;
    dev.pass_progressed = false;
    dev.pass_waiting = -1;
    if (progressed || waiting < 0 || dev.counters.paused) {
      dev.stuck_passes = 0;  // a paused device waits for its sink, not for a lost packet
      continue;
    }
    // A blocked block may hold the expected packet: no gap can be concluded meanwhile.
    bool any_blocked = std::any_of(blocked_.begin(), blocked_.end(), [](const auto& b) { return b.second; });
    if (any_blocked || ++dev.stuck_passes < 2) continue;
    // Two passes without the expected packet while a later one waits: a real gap.
    counters_.gaps += static_cast<uint64_t>(waiting);
    dev.counters.gaps += static_cast<uint64_t>(waiting);
    dev.expected += static_cast<uint32_t>(waiting);
    dev.stuck_passes = 0;
    dev.taken_up.reset();
    if (dev.open) {
      sink_.abort(d);
      dev.open = false;
      ++counters_.broken_messages;
    }
  }
  pass_interrupted_ = false;
  return Status::ok();
}

uint64_t Delivery::abort_partials() {
  uint64_t n = 0;
  for (auto& [d, dev] : devices_) {
    if (!dev.open) continue;
    sink_.abort(d);
    dev.open = false;
    dev.taken_up.reset();
    ++n;
  }
  pending_.reset();
  counters_.partial_discarded += n;
  return n;
}

bool Delivery::has_open_message() const {
  return std::any_of(devices_.begin(), devices_.end(), [](const auto& kv) { return kv.second.open; });
}

bool Delivery::any_paused() const {
  return std::any_of(devices_.begin(), devices_.end(), [](const auto& kv) { return kv.second.counters.paused; });
}

uint64_t Delivery::messages(uint16_t device) const {
  auto it = devices_.find(device);
  return it == devices_.end() ? 0 : it->second.counters.messages;
}

std::map<uint16_t, DeviceStats> Delivery::per_device() const {
  std::map<uint16_t, DeviceStats> out;
  for (const auto& [d, dev] : devices_) out[d] = dev.counters;
  return out;
}

}  // namespace slotstream::stream
