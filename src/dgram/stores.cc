#include "dgram/stores.h"

namespace slotstream::dgram {

Status DirStore::store(const Delivered& m) {
  auto it = base_.find(m.device);
  if (it == base_.end()) {
    uint64_t next = 0;
    SLOTSTREAM_RETURN_IF_ERROR(sink_.next_seq(m.device, &next));
    // The first message stored may not be message 0 (0 was lost): number from where 0 would be.
    it = base_.emplace(m.device, next).first;
  }
  SLOTSTREAM_RETURN_IF_ERROR(sink_.skip_to(m.device, it->second + m.msn));
  if (m.partial) return sink_.store_partial(m.device, m.data, valid_ranges_json(*m.valid));
  SLOTSTREAM_RETURN_IF_ERROR(sink_.begin(m.device));
  if (Status st = sink_.append(m.device, m.data); !st.is_ok()) {
    sink_.abort(m.device);
    return st;
  }
  if (Status st = sink_.commit(m.device); !st.is_ok()) {
    sink_.abort(m.device);
    return st;
  }
  return Status::ok();
}

}  // namespace slotstream::dgram
