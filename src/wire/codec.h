// Little-endian byte writer/reader shared by the block header and the control messages.
// The reader never reads past its end: a short buffer sets `ok = false` and yields zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slotstream::wire {

// n (1..8) little-endian bytes at p: the fixed-layout headers' field access.
inline void put_le(std::byte* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint64_t get_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(std::span<const uint8_t> b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  // Strings/blobs with an explicit length prefix of 1, 2 or 4 bytes.
  void str8(std::string_view s) {
    u8(static_cast<uint8_t>(s.size()));
    raw(s);
  }
  void str16(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    raw(s);
  }
  void blob32(std::span<const uint8_t> b) {
    u32(static_cast<uint32_t>(b.size()));
    bytes(b);
  }
  std::vector<uint8_t>& buffer() { return buf_; }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void raw(std::string_view s) { buf_.insert(buf_.end(), s.begin(), s.end()); }
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::span<const uint8_t> bytes(size_t n) {
    if (!take(n)) return {};
    return in_.subspan(pos_ - n, n);
  }
  std::string str8() { return as_string(bytes(u8())); }
  std::string str16() { return as_string(bytes(u16())); }
  std::vector<uint8_t> blob32(size_t max) {
    uint32_t n = u32();
    if (n > max) {
      ok_ = false;
      return {};
    }
    auto b = bytes(n);
    return {b.begin(), b.end()};
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  static std::string as_string(std::span<const uint8_t> b) { return {b.begin(), b.end()}; }
  bool take(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t le(int n) {
    if (!take(n)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(in_[pos_ - n + i]) << (8 * i);
    return v;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace slotstream::wire
