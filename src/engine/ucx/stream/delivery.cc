#include "engine/ucx/stream/delivery.h"

#include <algorithm>

#include "engine/ucx/stream/trace.h"

namespace slotstream::stream {

namespace {
constexpr uint32_t kNoBlock = 0xFFFFFFFFu;  // Message::block of a record copied aside (parked)
constexpr uint16_t kSmallIds = 4096;        // devices below this are found in a table

double seconds_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
}  // namespace

uint64_t Delivery::window(uint64_t max_records, uint64_t per_unit) {
  const uint64_t in_flight = std::max<uint64_t>(1, max_records) * std::max<uint64_t>(1, per_unit);
  return std::min<uint64_t>(4 * std::max<uint64_t>(64, in_flight), uint64_t(1) << 30);
}

Delivery::Delivery(protocol::ReceiverProtocol& proto, MessageSink& sink, const std::vector<uint16_t>& devices,
                   uint32_t block_size)
    : proto_(proto),
      sink_(sink) {
  std::vector<uint16_t> ids = devices;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (uint16_t d : ids) devices_.push_back(DeviceState{.id = d});
  if (!ids.empty() && ids.back() < kSmallIds) {
    device_table_.assign(size_t(ids.back()) + 1, -1);
    for (size_t i = 0; i < ids.size(); ++i) device_table_[ids[i]] = int32_t(i);
  }
  // A packed record takes at least its 16-byte header.
  window_ = window(proto.max_records(), block_size / wire::kBlockHeaderSize);
}

int32_t Delivery::find_device(uint16_t id) const {
  if (!device_table_.empty()) return id < device_table_.size() ? device_table_[id] : -1;
  auto it =
      std::lower_bound(devices_.begin(), devices_.end(), id, [](const DeviceState& d, uint16_t v) { return d.id < v; });
  return it != devices_.end() && it->id == id ? int32_t(it - devices_.begin()) : -1;
}

// ------------------------------------------------------------------------------------ pass

Status Delivery::pass(size_t* consumed, std::chrono::steady_clock::time_point now) {
  *consumed = 0;
  lend_limited_ = false;
  pass_now_ = now;
  SLOTSTREAM_RETURN_IF_ERROR(retry_pending(consumed));
  collect(now, consumed);
  if (pass_interrupted_) {  // the last pass returned an error half-way: forget its marks
    for (DeviceState& dev : devices_) {
      dev.pass_progressed = false;
      dev.pass_waiting = -1;
    }
  }
  pass_interrupted_ = true;
  const Status st = order(now, consumed);
  if (st.is_ok()) park_paused();
  // Also after an error: what was consumed is released or remembered, never offered twice.
  release_units();
  compact_parked();
  SLOTSTREAM_RETURN_IF_ERROR(st);
  detect_gaps();
  pass_interrupted_ = false;
  return Status::ok();
}

// Every device's next records in the order found (units come mostly in sending order), then what
// came ahead of its predecessor, nearest first; whole messages go to the sink in batches.
Status Delivery::order(std::chrono::steady_clock::time_point now, size_t* consumed) {
  for (uint32_t i = 0; i < entries_.size(); ++i) SLOTSTREAM_RETURN_IF_ERROR(consider(i, now, true, consumed));
  SLOTSTREAM_RETURN_IF_ERROR(flush(now, consumed));
  if (deferred_.empty()) return Status::ok();
  std::sort(deferred_.begin(), deferred_.end(), [&](uint32_t a, uint32_t b) {
    const Entry &x = entries_[a], &y = entries_[b];
    if (x.dev != y.dev) return x.dev < y.dev;
    const uint32_t exp = devices_[x.dev].expected;
    return wire::packet_distance(exp, x.header.packet) < wire::packet_distance(exp, y.header.packet);
  });
  for (uint32_t i : deferred_) SLOTSTREAM_RETURN_IF_ERROR(consider(i, now, false, consumed));
  return flush(now, consumed);
}

Status Delivery::retry_pending(size_t* consumed) {
  if (!pending_) return Status::ok();
  Pending p = *pending_;
  pending_.reset();
  SLOTSTREAM_RETURN_IF_ERROR(apply(p.entry, p.stage, p.unit_id));
  DeviceState& dev = devices_[p.entry.dev];
  ++dev.expected;
  ++*consumed;
  if (p.entry.unit == kParked) {
    Parked& parked = dev.parked[p.entry.mark];
    parked.taken = true;
    parked_bytes_ -= parked.payload.size();
    compact_parked();
  } else {
    remember(p.unit_id, p.entry.index);  // its unit is polled again below: skip it there
  }
  return Status::ok();
}

void Delivery::collect(std::chrono::steady_clock::time_point now, size_t* consumed) {
  records_.clear();
  proto_.poll(&records_);
  seen_data_ |= !records_.empty();
  units_.clear();
  marks_.clear();
  entries_.clear();
  deferred_.clear();
  pass_held_ = pass_useful_ = 0;
  traced_ = tracing();
  collect_parked();
  for (const protocol::Record& rec : records_) {
    pass_held_ += rec.bytes.size();
    if (!blocked_.empty()) {
      auto b = blocked_.find(rec.slot);
      if (b != blocked_.end() && b->second) continue;
    }
    collect_unit(rec, consumed);
  }
  if (last_pass_) {
    const double dt = double(std::chrono::duration_cast<std::chrono::nanoseconds>(now - *last_pass_).count());
    counters_.buffer_held_byte_ns += double(last_held_) * dt;
    counters_.buffer_useful_byte_ns += double(last_useful_) * dt;
    counters_.buffer_observed_ns += dt;
  }
  last_pass_ = now;
  last_held_ = pass_held_;
  last_useful_ = pass_useful_;
}

// Records copied aside while their device was paused come first: they are its oldest.
void Delivery::collect_parked() {
  for (uint32_t d = 0; d < devices_.size(); ++d) {
    auto& parked = devices_[d].parked;
    for (uint32_t k = 0; k < parked.size(); ++k) {
      entries_.push_back({parked[k].header, parked[k].payload, d, kParked, k, 0});
      pass_useful_ += parked[k].payload.size();
    }
  }
}

// Unpacks one unit: its records become entries, except those consumed in an earlier pass, void
// ones, unknown devices (counted, never written as data) and a bad rest (counted once).
void Delivery::collect_unit(const protocol::Record& rec, size_t* consumed) {
  const auto part = std::find_if(partial_.begin(), partial_.end(), [&](const Partial& p) { return p.id == rec.id; });
  const Partial* seen = part == partial_.end() ? nullptr : &*part;
  const auto unit = uint32_t(units_.size());
  UnitState u{rec, uint32_t(marks_.size())};
  wire::UnitReader reader(rec.bytes);
  for (wire::UnitReader::Item it; reader.next(&it);) {
    const auto mark = uint32_t(marks_.size());
    marks_.push_back(1);  // consumed unless it becomes an entry below
    ++u.records;
    if (seen && seen->has(it.index)) continue;
    const int32_t d = it.header.is_void() ? -1 : find_device(it.header.device);
    if (d < 0) {
      if (!it.header.is_void()) ++counters_.unknown_device;
      ++*consumed;
      continue;
    }
    marks_[mark] = 0;
    ++u.left;
    entries_.push_back({it.header, it.payload, uint32_t(d), unit, mark, it.index});
    pass_useful_ += it.header.payload_length;
    if (traced_) trace(TraceStage::kPolled, it.header.device, it.header.packet);
  }
  if (reader.bad()) {  // the rest of the unit cannot be trusted: one bad record
    marks_.push_back(1);
    if (!(seen && seen->has(u.records))) {
      ++counters_.bad_headers;
      ++*consumed;
    }
    ++u.records;
  }
  units_.push_back(u);
}

Status Delivery::consider(uint32_t i, std::chrono::steady_clock::time_point now, bool defer, size_t* consumed) {
  const Entry& e = entries_[i];
  DeviceState& dev = devices_[e.dev];
  const int64_t dist = wire::packet_distance(dev.expected, e.header.packet);
  if (dist < 0) {
    ++counters_.duplicates;
    ++dev.counters.duplicates;
    consume(e, consumed);
    return Status::ok();
  }
  if (dist >= int64_t(window_)) {
    ++counters_.out_of_window;
    consume(e, consumed);
    return Status::ok();
  }
  if (dist > 0) {
    if (defer) {
      deferred_.push_back(i);
    } else if (dev.pass_waiting < 0) {
      dev.pass_waiting = dist;  // deferred entries are sorted: the nearest first
    }
    return Status::ok();
  }
  if (dev.counters.paused && now < dev.retry_at) return Status::ok();  // its records wait
  if (e.header.first() && e.header.last()) {                           // a whole message: into the batch
    if (dev.open) {  // the previous message never got its last fragment
      sink_.abort(dev.id);
      dev.open = false;
      dev.taken_up.reset();
      ++counters_.broken_messages;
    }
    batch_.push_back(i);
    ++dev.expected;
    dev.pass_progressed = true;
    return Status::ok();
  }
  // A piece of a message that spans blocks: after everything batched so far (per-device order).
  SLOTSTREAM_RETURN_IF_ERROR(flush(now, consumed));
  if (wire::packet_distance(dev.expected, e.header.packet) != 0 || (dev.counters.paused && now < dev.retry_at)) {
    return Status::ok();  // the batch was refused for this device: its records wait
  }
  return deliver_piece(e, now, consumed);
}

Status Delivery::deliver_piece(const Entry& e, std::chrono::steady_clock::time_point now, size_t* consumed) {
  DeviceState& dev = devices_[e.dev];
  const uint64_t unit_id = e.unit == kParked ? 0 : units_[e.unit].record.id;
  Status st = apply(e, Stage::kBegin, unit_id);
  if (st.code() == Code::kBusy && pending_ && pending_->stage == Stage::kBegin) {
    pending_.reset();  // nothing of this message was started: pause the device, not the pass
    pause(dev, now);
    return Status::ok();
  }
  SLOTSTREAM_RETURN_IF_ERROR(st);
  consume(e, consumed);
  ++dev.expected;
  resumed(dev);
  dev.pass_progressed = true;
  return Status::ok();
}

// Hands the batched whole messages to the sink in one call (more only after a refusal). A
// refused message and those after it are undone (their devices expect them again); kBusy pauses
// that device alone and the others' messages go on.
Status Delivery::flush(std::chrono::steady_clock::time_point now, size_t* consumed) {
  size_t pos = 0;
  while (pos < batch_.size()) {
    messages_.clear();
    const size_t end = lender_ ? pos + gather_leases(pos) : batch_.size();
    for (size_t k = pos; k < end; ++k) {
      const Entry& e = entries_[batch_[k]];
      messages_.push_back({e.header.device, e.header.packet, e.unit == kParked ? kNoBlock : e.unit, e.payload});
    }
    size_t stored = 0;
    const Status st = lender_ ? lender_->lend(messages_, leases_, &stored) : sink_.deliver(messages_, &stored);
    const auto stored_at = std::chrono::steady_clock::now();
    stored = st.is_ok() ? messages_.size() : std::min(stored, messages_.size());
    uint64_t of_this_pass = 0;  // stored messages this pass took up: one store latency for all of them
    for (size_t k = pos; k < pos + stored; ++k) {
      const Entry& e = entries_[batch_[k]];
      consume(e, consumed);
      DeviceState& dev = devices_[e.dev];
      if (dev.taken_up) {
        delivered(dev, e.header.payload_length, e.header.packet, stored_at);
      } else {
        ++of_this_pass;
        counted(dev, e.header.payload_length, e.header.packet);
      }
      resumed(dev);
    }
    // One bucket lookup for the whole batch (a lookup per message was 6 % of a small-message receiver's time).
    counters_.store_latency.observe(seconds_between(pass_now_, stored_at), of_this_pass);
    pos += stored;
    leases_.clear();                          // the views hold theirs
    if (st.is_ok() && pos < batch_.size()) {  // the lending limit: the rest waits in its units
      roll_back(pos);
      ++counters_.lend_limited;
      lend_limited_ = true;
      break;
    }
    if (st.is_ok()) break;
    roll_back(pos);
    if (st.code() != Code::kBusy) {
      batch_.clear();
      return st;
    }
    const uint32_t paused = entries_[batch_[pos]].dev;
    pause(devices_[paused], now);
    // The paused device's messages leave the batch; the others' are expected past again.
    auto keep = std::remove_if(batch_.begin() + std::ptrdiff_t(pos), batch_.end(),
                               [&](uint32_t k) { return entries_[k].dev == paused; });
    batch_.erase(keep, batch_.end());
    for (size_t k = pos; k < batch_.size(); ++k) {
      const Entry& e = entries_[batch_[k]];
      devices_[e.dev].expected = e.header.packet + 1;
    }
  }
  batch_.clear();
  return Status::ok();
}

// Zero-copy: a lease for each batch entry from `pos` on (nullptr for a parked record: copied),
// until the lending limit. Returns how many entries got one.
size_t Delivery::gather_leases(size_t pos) {
  leases_.clear();
  for (size_t k = pos; k < batch_.size(); ++k) {
    const Entry& e = entries_[batch_[k]];
    if (e.unit == kParked) {
      leases_.emplace_back();
      continue;
    }
    auto lease = unit_lease(e.unit);
    if (!lease) break;
    leases_.push_back(std::move(lease));
  }
  return leases_.size();
}

// A unit lent in an earlier pass whose views are still alive keeps its lease (one per unit, counted
// once); one whose views were all released gets a new one.
std::shared_ptr<BlockLease> Delivery::unit_lease(uint32_t unit) {
  UnitState& u = units_[unit];
  if (u.lease) return u.lease;
  const uint64_t id = u.record.id;
  auto it = std::find_if(lent_units_.begin(), lent_units_.end(), [&](const LentUnit& l) { return l.id == id; });
  if (it != lent_units_.end() && (u.lease = it->lease.lock())) return u.lease;
  u.lease = lending_->lease(id);
  if (!u.lease) return nullptr;
  if (it != lent_units_.end()) {
    it->lease = u.lease;
  } else {
    lent_units_.push_back({id, u.lease});
  }
  return u.lease;
}

// Batch entries from `from` on were not stored: each device expects its first of them again.
void Delivery::roll_back(size_t from) {
  for (size_t k = batch_.size(); k-- > from;) {
    const Entry& e = entries_[batch_[k]];
    devices_[e.dev].expected = e.header.packet;
  }
}

void Delivery::pause(DeviceState& dev, std::chrono::steady_clock::time_point now) {
  dev.retry_at = now + kBusyRetry;
  if (!dev.taken_up) dev.taken_up = now;  // its next message waits for the sink from now: that counts
  if (dev.counters.paused) return;
  dev.counters.paused = true;
  ++dev.counters.pauses;
  if (on_pause_) on_pause_(dev.id, true);
}

void Delivery::resumed(DeviceState& dev) {
  if (!dev.counters.paused) return;
  dev.counters.paused = false;
  if (on_pause_) on_pause_(dev.id, false);
}

// `stored_at`: when the sink had it; the store latency runs from the pass that first took the
// message up (dev.taken_up while it waited for a busy sink or spanned passes, else this pass).
void Delivery::delivered(DeviceState& dev, uint64_t bytes, uint32_t packet,
                         std::chrono::steady_clock::time_point stored_at) {
  counters_.store_latency.observe(seconds_between(dev.taken_up.value_or(pass_now_), stored_at));
  counted(dev, bytes, packet);
}

// A message stored, its store latency observed by the caller.
void Delivery::counted(DeviceState& dev, uint64_t bytes, uint32_t packet) {
  if (traced_) trace(TraceStage::kDelivered, dev.id, packet);
  dev.taken_up.reset();
  ++dev.counters.messages;
  dev.counters.bytes += bytes;
  ++counters_.messages;
  counters_.bytes += bytes;
}

bool Delivery::is_consumed(const Entry& e) const {
  return e.unit == kParked ? devices_[e.dev].parked[e.mark].taken : marks_[e.mark] != 0;
}

void Delivery::consume(const Entry& e, size_t* consumed) {
  ++*consumed;
  if (e.unit == kParked) {
    Parked& p = devices_[e.dev].parked[e.mark];
    p.taken = true;
    parked_bytes_ -= p.payload.size();
    return;
  }
  marks_[e.mark] = 1;
  --units_[e.unit].left;
}

// A paused device's records that share a packed unit with other records are copied aside, so
// that the unit can be released and the other devices keep flowing (a unit of its own waits in
// place, as a block always did).
void Delivery::park_paused() {
  if (!any_paused()) return;
  for (const Entry& e : entries_) {
    if (e.unit == kParked || marks_[e.mark] || units_[e.unit].records < 2) continue;
    DeviceState& dev = devices_[e.dev];
    if (!dev.counters.paused || parked_bytes_ + e.payload.size() > park_limit_) continue;
    dev.parked.push_back({e.header, std::vector<std::byte>(e.payload.begin(), e.payload.end())});
    parked_bytes_ += e.payload.size();
    ++counters_.parked;
    marks_[e.mark] = 1;
    --units_[e.unit].left;
  }
}

// One release per unit whose records are all consumed; the consumed records of the others are
// remembered so that the next pass skips them.
void Delivery::release_units() {
  for (UnitState& u : units_) {
    auto part = std::find_if(partial_.begin(), partial_.end(), [&](const Partial& p) { return p.id == u.record.id; });
    if (u.left == 0) {
      release_unit(u);
      ++counters_.units;
      if (part != partial_.end()) partial_.erase(part);
      continue;
    }
    // Zero-copy: a unit some of whose records wait is held by its views alone, not by the delivery
    // (else such units, their views released, could take up the whole held limit, and the records
    // they wait for, in other units, could never be lent).
    u.lease.reset();
    const auto first = marks_.begin() + u.first_mark, last = first + u.records;
    if (std::find(first, last, uint8_t(1)) == last) continue;  // nothing of it consumed yet
    if (part == partial_.end()) part = partial_.insert(partial_.end(), Partial{u.record.id, {}});
    part->consumed.assign(first, last);
  }
}

// A unit with lent messages is retained (paper §3.3: status 2) and left to its views: the last
// one released gives it back (BlockLease). The others are released now.
// A unit whose views were all released before its last record was consumed is released as any.
void Delivery::release_unit(UnitState& u) {
  std::shared_ptr<BlockLease> lease = std::move(u.lease);
  if (!lent_units_.empty()) {  // lent in an earlier pass, the rest consumed in this one
    auto it =
        std::find_if(lent_units_.begin(), lent_units_.end(), [&](const LentUnit& l) { return l.id == u.record.id; });
    if (it != lent_units_.end()) {
      if (!lease) lease = it->lease.lock();
      lent_units_.erase(it);
    }
  }
  if (!lease) {
    proto_.release(u.record.id);
    return;
  }
  proto_.retain(u.record.id);
  lease->retained = true;
}

void Delivery::remember(uint64_t unit_id, uint32_t index) {
  auto part = std::find_if(partial_.begin(), partial_.end(), [&](const Partial& p) { return p.id == unit_id; });
  if (part == partial_.end()) part = partial_.insert(partial_.end(), Partial{unit_id, {}});
  if (part->consumed.size() <= index) part->consumed.resize(index + 1, 0);
  part->consumed[index] = 1;
}

void Delivery::compact_parked() {
  for (uint32_t d = 0; d < devices_.size(); ++d) {
    auto& parked = devices_[d].parked;
    if (parked.empty()) continue;
    uint32_t kept = 0;
    for (uint32_t k = 0; k < parked.size(); ++k) {
      if (parked[k].taken) continue;
      // A message begun from a parked record and not finished keeps pointing at it.
      if (pending_ && pending_->entry.unit == kParked && pending_->entry.dev == d && pending_->entry.mark == k) {
        pending_->entry.mark = kept;
      }
      if (kept != k) parked[kept] = std::move(parked[k]);
      ++kept;
    }
    parked.resize(kept);
  }
}

void Delivery::detect_gaps() {
  // A blocked block may hold the expected packet: no gap can be concluded meanwhile.
  const bool any_blocked = std::any_of(blocked_.begin(), blocked_.end(), [](const auto& b) { return b.second; });
  for (DeviceState& dev : devices_) {
    const bool progressed = dev.pass_progressed;
    const int64_t waiting = dev.pass_waiting;
    dev.pass_progressed = false;
    dev.pass_waiting = -1;
    if (progressed || waiting < 0 || dev.counters.paused) {
      dev.stuck_passes = 0;  // a paused device waits for its sink, not for a lost packet
      continue;
    }
    // At the lending limit the expected packet may wait behind it, not be lost.
    if (any_blocked || lend_limited_ || ++dev.stuck_passes < 2) continue;
    // Two passes without the expected packet while a later one waits: a real gap.
    counters_.gaps += static_cast<uint64_t>(waiting);
    dev.counters.gaps += static_cast<uint64_t>(waiting);
    dev.expected += static_cast<uint32_t>(waiting);
    dev.stuck_passes = 0;
    dev.taken_up.reset();
    if (dev.open) {
      sink_.abort(dev.id);
      dev.open = false;
      ++counters_.broken_messages;
    }
  }
}

// ---------------------------------------------------------------- one piece of a long message

Status Delivery::apply(const Entry& e, Stage stage, uint64_t unit_id) {
  const wire::BlockHeader& h = e.header;
  DeviceState& dev = devices_[e.dev];
  auto fail = [&](Status st, Stage at) {
    pending_ = Pending{e, unit_id, at};
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
      if (lender_) lender_->set_first_packet(h.packet);
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
    if (Status st = sink_.append(h.device, e.payload); !st.is_ok()) return fail(st, Stage::kAppend);
    dev.open_bytes += e.payload.size();
    stage = Stage::kCommit;
  }
  if (h.last()) {
    if (Status st = sink_.commit(h.device); !st.is_ok()) return fail(st, Stage::kCommit);
    dev.open = false;
    delivered(dev, dev.open_bytes, h.packet, std::chrono::steady_clock::now());
  }
  return Status::ok();
}

// ------------------------------------------------------------------------------- queries

uint64_t Delivery::abort_partials() {
  uint64_t n = 0;
  for (DeviceState& dev : devices_) {
    if (!dev.open) continue;
    sink_.abort(dev.id);
    dev.open = false;
    dev.taken_up.reset();
    ++n;
  }
  pending_.reset();
  counters_.partial_discarded += n;
  return n;
}

bool Delivery::has_open_message() const {
  return std::any_of(devices_.begin(), devices_.end(), [](const DeviceState& d) { return d.open; });
}

bool Delivery::any_paused() const {
  return std::any_of(devices_.begin(), devices_.end(), [](const DeviceState& d) { return d.counters.paused; });
}

uint64_t Delivery::messages(uint16_t device) const {
  const int32_t i = find_device(device);
  return i < 0 ? 0 : devices_[i].counters.messages;
}

std::map<uint16_t, DeviceStats> Delivery::per_device() const {
  std::map<uint16_t, DeviceStats> out;
  for (const DeviceState& dev : devices_) out[dev.id] = dev.counters;
  return out;
}

}  // namespace slotstream::stream
