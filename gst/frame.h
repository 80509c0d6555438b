// What slotstreamsink puts in each slotstream message, and how slotstreamsrc takes it apart. Plain C++:
// no GStreamer type appears here, so the layout is unit-tested without GStreamer (tests/gst/frame_test.cc).
//
// A device's stream is: a caps message, then one buffer message per GstBuffer (a new caps message
// wherever the caps change), then an end-of-stream message. Every message starts with the same 8 bytes;
// all integers are little-endian.
//
//   byte  0        1        2        3        4        5        6        7
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     0 |  'S'   |  'S'   |  'G'   |  'F'   | version|  kind  |   reserved (0)  |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//   caps (kind 1):
//     8 |     caps length (u32)             |        reserved (0)               |
//    16 | caps string (gst_caps_to_string, UTF-8, no NUL) ...
//   buffer (kind 2): seven u64 fields, then the payload (the buffer's bytes)
//     8 | payload length    16 | pts            24 | dts            32 | duration
//    40 | offset            48 | offset end     56 | flags (u32: GstBufferFlags), reserved (u32, 0)
//    64 | sent: the sender's pipeline-clock time when slotstreamsink took the buffer (all ones: unknown)
//    72 | reserved (u64, 0)
//    80 | payload ...
//   end of stream (kind 3): nothing after the 8 bytes.
//
// Times are nanoseconds, all ones = GST_CLOCK_TIME_NONE (offsets: GST_BUFFER_OFFSET_NONE), as in GStreamer.
// The buffer header is 80 bytes so that a payload that starts a receive block (after slotstream's 16-byte
// block header) is 32-byte aligned: the zero-copy receive path hands that memory downstream as it lies.
// Unknown versions or kinds are rejected (no silent forward compatibility); set reserved bits are refused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slotstream/status.h"

namespace slotstream::gst {

inline constexpr std::array<char, 4> kFrameMagic = {'S', 'S', 'G', 'F'};
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kPreambleSize = 8;
inline constexpr size_t kCapsHeaderSize = 16;
inline constexpr size_t kBufferHeaderSize = 80;
inline constexpr size_t kMaxCapsLength = 64 * 1024;  // a caps string longer than this is not a caps string
inline constexpr uint64_t kNone = ~uint64_t(0);      // GST_CLOCK_TIME_NONE, GST_BUFFER_OFFSET_NONE

enum class FrameKind : uint8_t { kCaps = 1, kBuffer = 2, kEos = 3 };

// A buffer's metadata as it travels (GstBuffer's fields of the same names).
struct BufferHeader {
  uint64_t payload_length = 0;
  uint64_t pts = kNone;
  uint64_t dts = kNone;
  uint64_t duration = kNone;
  uint64_t offset = kNone;
  uint64_t offset_end = kNone;
  uint32_t flags = 0;
  uint64_t sent = kNone;
  bool operator==(const BufferHeader&) const = default;
};

// Sending side: the bytes of a caps or end-of-stream message, and a buffer message's header (its payload
// follows in the same message).
std::vector<std::byte> encode_caps(std::string_view caps);
std::vector<std::byte> encode_eos();
void encode_buffer_header(const BufferHeader& h, std::span<std::byte, kBufferHeaderSize> out);

// One received message, decoded.
struct Frame {
  FrameKind kind = FrameKind::kEos;
  std::string caps;     // kCaps
  BufferHeader buffer;  // kBuffer; its payload went where Assembler's `allocate` said
};

// Receiving side: rebuilds one message from the pieces a slotstream sink is handed (begin, append...,
// commit), copying the payload once, into memory the caller provides as soon as its length is known; or
// decodes a message lent whole (decode_in_place: zero-copy, the payload is not moved).
class Assembler {
 public:
  // Where a buffer's payload goes: called once per buffer message, with its length, when its header is
  // complete. An empty span for a non-zero length is an error (no memory).
  using Allocate = std::function<std::span<std::byte>(uint64_t length)>;

  void reset();
  // The next piece of the message. An error says what is wrong with the message (not a slotstreamsink
  // message, a newer version, longer than its header says); the rest of that message should be dropped.
  Status feed(std::span<const std::byte> data, const Allocate& allocate);
  // The message ended: *out is its frame, or an error if it was cut short.
  Status finish(Frame* out);
  // A whole message in one span (a zero-copy view of its receive block): *out is its frame and *payload
  // where a buffer's payload lies inside `message` — nothing is copied but a caps string. Same errors.
  Status decode_in_place(std::span<const std::byte> message, Frame* out, std::span<const std::byte>* payload);

 private:
  Status parse_header();
  size_t header_size() const;

  std::array<std::byte, kBufferHeaderSize> header_{};
  size_t header_have_ = 0;
  bool header_done_ = false;
  Frame frame_;
  uint64_t body_length_ = 0;  // caps string or payload
  uint64_t body_have_ = 0;
  std::span<std::byte> payload_;  // kBuffer: where its bytes go
  bool in_place_ = false;         // decode_in_place: the payload stays where it lies
};

}  // namespace slotstream::gst
