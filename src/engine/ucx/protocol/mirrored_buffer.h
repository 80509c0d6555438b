// A ring's local memory mapped twice, back to back (the thesis's "magic buffer"): bytes
// [size, 2 x size) are the same physical pages as [0, size), so `size` bytes starting anywhere in
// [0, size) are contiguous in the address space. A ring protocol copies a span that wraps around
// the end of the ring in one piece and hands out a record that wraps as one std::span — no
// reassembly, no second copy.
//
// How: one memfd of `size` bytes, an address range of 2 x size reserved with PROT_NONE, and the
// file mapped MAP_SHARED | MAP_FIXED into both halves. `size` is a multiple of the page size.
//
// Threading: none of its own; the owner decides who touches the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "slotstream/status.h"

namespace slotstream::protocol {

class MirroredBuffer {
 public:
  // At least `min_size` bytes (rounded up to whole pages), zero-filled.
  static Status create(size_t min_size, std::unique_ptr<MirroredBuffer>* out);
  ~MirroredBuffer();
  MirroredBuffer(const MirroredBuffer&) = delete;
  MirroredBuffer& operator=(const MirroredBuffer&) = delete;

  // 2 x size() addressable bytes; data()[i] and data()[i + size()] are the same byte.
  std::byte* data() const { return base_; }
  size_t size() const { return size_; }
  // Where ring position `pos` (a byte counter that never wraps) lies: in [0, size()).
  std::byte* at(uint64_t pos) const { return base_ + pos % size_; }

 private:
  MirroredBuffer(std::byte* base, size_t size) : base_(base), size_(size) {}
  std::byte* base_;
  size_t size_;
};

}  // namespace slotstream::protocol
