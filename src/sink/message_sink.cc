// MessageSink's batch call for sinks that take one message at a time, and its datagram call for sinks
// that keep no partial messages (slotstream.h).
#include "slotstream/slotstream.h"

namespace slotstream {

Status MessageSink::deliver(std::span<const Message> batch, size_t* stored) {
  for (*stored = 0; *stored < batch.size(); ++*stored) {
    const Message& m = batch[*stored];
    SLOTSTREAM_RETURN_IF_ERROR(begin(m.device));
    Status st = append(m.device, m.data);
    if (st.is_ok()) st = commit(m.device);
    if (!st.is_ok()) {
      abort(m.device);  // nothing of it stays: offered again whole
      return st;
    }
  }
  return Status::ok();
}

Status MessageSink::deliver_datagram(const DatagramMessage& m) {
  if (m.partial) return Status::ok();  // not kept here (the report counts it as partial)
  SLOTSTREAM_RETURN_IF_ERROR(begin(m.device));
  Status st = append(m.device, m.data);
  if (st.is_ok()) st = commit(m.device);
  if (!st.is_ok()) abort(m.device);
  return st;
}

}  // namespace slotstream
