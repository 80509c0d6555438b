// How a received message reaches Python: a Frame (a copy the Python object owns) or a PyView (the message lent
// in place, Receiver(..., zero_copy=True)), both read through the buffer protocol.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "common.h"

namespace slotstream::py {

// One received message, owned: the receiver's block is reused as soon as the sink returns, so a
// message is copied out once (append) and the Python side gets a view of this copy that it may
// keep as long as it likes. Exposed to Python through the buffer protocol (memoryview, numpy).
struct Frame {
  std::byte* data = nullptr;
  size_t size = 0;
  size_t capacity = 0;

  Frame() = default;
  Frame(Frame&& o) noexcept : data(o.data), size(o.size), capacity(o.capacity) {
    o.data = nullptr;
    o.size = o.capacity = 0;
  }
  Frame& operator=(Frame&& o) noexcept {
    std::swap(data, o.data);
    std::swap(size, o.size);
    std::swap(capacity, o.capacity);
    return *this;
  }
  Frame(const Frame&) = delete;
  ~Frame() { std::free(data); }

  // Appends a fragment; kBusy (retried later, nothing lost) if memory is short.
  Status append(std::span<const std::byte> bytes) {
    if (size + bytes.size() > capacity) {
      size_t want = std::max(size + bytes.size(), capacity * 2);
      auto* grown = static_cast<std::byte*>(std::realloc(data, want ? want : 1));
      if (!grown) return {Code::kBusy, "out of memory for a " + std::to_string(want) + "-byte message"};
      data = grown;
      capacity = want;
    }
    if (!bytes.empty()) std::memcpy(data + size, bytes.data(), bytes.size());
    size += bytes.size();
    return Status::ok();
  }
};

// One message lent in place (Receiver(..., zero_copy=True); slotstream.h MessageView): the buffer
// protocol exports the receive block itself, read-only. Its block stays held (status 2: the sender
// skips it) until release(), the end of a `with` block, or garbage collection. release() while a
// memoryview or numpy array still uses the bytes is refused (BufferError): the block would be
// rewritten under it; once released, exporting raises instead of reading reused memory.
struct PyView {
  MessageView view;
  std::string sender;
  uint64_t seq = 0;
  Py_ssize_t exports = 0;  // buffers handed out and not yet given back (GIL held)

  void release() {
    if (exports > 0) {
      throw nb::buffer_error((std::to_string(exports) +
                              " memoryview/numpy object(s) still use this message: delete them before release() "
                              "(the message's block would be rewritten under them)")
                                 .c_str());
    }
    view.release();
  }
};

// A memoryview of a Frame the Python object now owns.
nb::object memoryview_of(Frame&& frame);

}  // namespace slotstream::py
