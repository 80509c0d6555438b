#include "dgram/stores.h"

namespace slotstream::dgram {

Status DirStore::store(const Delivered& m) {
  if (std::string why; workers_.over_limit && workers_.over_limit(m.device, &why)) {
    return {Code::kBusy, "worker backlog: " + why};
  }
  auto it = base_.find(m.device);
  if (it == base_.end()) {
    uint64_t next = 0;
    SLOTSTREAM_RETURN_IF_ERROR(sink_.next_seq(m.device, &next));
    // The first message stored may not be message 0 (0 was lost): number from where 0 would be.
    it = base_.emplace(m.device, next).first;
  }
  SLOTSTREAM_RETURN_IF_ERROR(sink_.skip_to(m.device, it->second + m.msn));
  if (m.partial) return sink_.store_partial(m.device, m.data, valid_ranges_json(*m.valid));
  return store_complete(m);
}

Status DirStore::store_complete(const Delivered& m) {
  SLOTSTREAM_RETURN_IF_ERROR(sink_.begin(m.device));
  if (Status st = sink_.append(m.device, m.data); !st.is_ok()) {
    sink_.abort(m.device);
    return st;
  }
  if (Status st = sink_.commit(m.device); !st.is_ok()) {
    sink_.abort(m.device);
    return st;
  }
  if (workers_.stored) {
    const auto last = sink_.last_committed(m.device);
    workers_.stored(m.device, last.seq, last.bytes);
  }
  return Status::ok();
}

std::string valid_ranges_json(const RangeSet& valid) {
  std::string s = "[";
  bool first = true;
  for (const auto& r : valid.ranges()) {
    if (!first) s += ",";
    first = false;
    s += "[" + std::to_string(r.offset) + "," + std::to_string(r.length) + "]";
  }
  return s + "]";
}

}  // namespace slotstream::dgram
