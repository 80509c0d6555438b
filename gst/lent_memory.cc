#include "lent_memory.h"

#include <utility>

namespace slotstream::gst {

GstBuffer* wrap_lent(MessageView view, std::span<const std::byte> payload) {
  GstBuffer* buf = gst_buffer_new();
  if (payload.empty()) return buf;  // `view` goes out of scope: released
  auto* held = new MessageView(std::move(view));
  auto* data = const_cast<std::byte*>(payload.data());  // not written through: the memory is READONLY
  gst_buffer_append_memory(
      buf, gst_memory_new_wrapped(GST_MEMORY_FLAG_READONLY, data, payload.size(), 0, payload.size(), held,
                                  [](gpointer v) { delete static_cast<MessageView*>(v); }));
  return buf;
}

}  // namespace slotstream::gst
