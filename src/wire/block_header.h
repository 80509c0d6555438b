// What the receiver finds in a block: one record (a block header and its payload), or a packed
// unit of several records behind a packed header. Sender block and receiver block alike.
//
// A record (version 1), at the start of a block or of a record slot in a packed unit:
//
//   byte  0        1        2        3        4        5        6        7
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     0 | version| flags  |  device (u16 LE) |      packet number (u32 LE)       |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     8 |      payload length (u32 LE)      |   check = ~(w0 ^ w1 ^ w2) (u32)   |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//    16 | payload ...
//
// w0, w1, w2 are the little-endian u32 words at bytes 0, 4 and 8.
//
// The paper (§3.2.1, Table 2) puts 1 byte of device number and 2 bytes of packet number in a
// block's "data status section". We widen both — 65,536 devices instead of 256, and a 32-bit
// per-device packet number so that the wrap-around is far outside any reorder window — and add
// what the paper leaves implicit: payload length (blocks are fixed-size, payloads are not),
// fragment flags (a frame larger than a block spans consecutive packets), a version and a
// check word that catches a torn or garbage header. All integers are little-endian on every
// platform. Unknown versions are rejected: no silent forward compatibility.
//
// A packed unit (version 2): small messages that a busy lane collected while it was
// transmitting leave together, one block and one status byte for all of them.
//
//   byte  0        1        2        3        4        5        6        7
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     0 | vers=2 | flags=0|  reserved (0)   |        record count (u32 LE)      |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     8 |  unit length (u32 LE, from byte 0)|   check = ~(w0 ^ w1 ^ w2) (u32)   |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//    16 | record 0 (version-1 header + payload) | pad to 8 | record 1 ... | pad to 8 |
//
// Records follow back to back from byte 16, each padded to a multiple of 8 bytes (the padding is
// not read); `unit length` counts the packed header, every record and every padding, so the
// records end exactly there and `record count` of them are found on the way. A unit whose header
// or whose records do not add up is refused as a whole from the first record that does not. A
// record flagged kVoid carries no message: space a filler reserved in a packed unit and could not
// fill (its fill failed); the receiver skips it. A lone message never gets a packed header: a
// unit of one record is sent as that record, byte for byte the version-1 block of before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace slotstream::wire {

inline constexpr uint8_t kBlockHeaderVersion = 1;
inline constexpr size_t kBlockHeaderSize = 16;
inline constexpr uint8_t kPackedVersion = 2;
inline constexpr size_t kPackedHeaderSize = 16;
inline constexpr size_t kRecordAlign = 8;  // records of a packed unit start at multiples of 8

enum BlockFlags : uint8_t {
  kFirstFragment = 1u << 0,  // this packet starts a message
  kLastFragment = 1u << 1,   // this packet ends a message (both set: a one-block message)
  kVoid = 1u << 2,           // no message (packed units only): reserved space a fill gave up
};
inline constexpr uint8_t kKnownFlags = kFirstFragment | kLastFragment | kVoid;

struct BlockHeader {
  uint8_t flags = 0;
  uint16_t device = 0;
  uint32_t packet = 0;  // per device, wraps at 2^32
  uint32_t payload_length = 0;

  bool first() const { return flags & kFirstFragment; }
  bool last() const { return flags & kLastFragment; }
  bool is_void() const { return flags & kVoid; }
  bool operator==(const BlockHeader&) const = default;
};

void encode_block_header(const BlockHeader& h, std::span<std::byte, kBlockHeaderSize> out);

enum class HeaderError { kNone, kVersion, kFlags, kCheck, kLength, kCount };
// Decodes and validates against the block's payload capacity. nullopt + reason on failure.
std::optional<BlockHeader> decode_block_header(std::span<const std::byte, kBlockHeaderSize> in, size_t payload_capacity,
                                               HeaderError* why = nullptr);
const char* header_error_name(HeaderError e);

// Bytes a record of `payload` bytes takes in a packed unit (header, payload, padding).
constexpr size_t packed_record_size(size_t payload) {
  return (kBlockHeaderSize + payload + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

struct PackedHeader {
  uint32_t records = 0;
  uint32_t length = 0;  // of the whole unit, this header included
  bool operator==(const PackedHeader&) const = default;
};

void encode_packed_header(const PackedHeader& h, std::span<std::byte, kPackedHeaderSize> out);
// Validates version, check word, length (at least the header plus one record per record, at
// most `capacity`, a multiple of 8) and a count of at least two.
std::optional<PackedHeader> decode_packed_header(std::span<const std::byte, kPackedHeaderSize> in, size_t capacity,
                                                 HeaderError* why = nullptr);

// The records of one unit — what a protocol handed over (Record::bytes: a whole block, or exactly
// what was sent): a single version-1 record, or a packed unit's records in order. `next()` yields
// each valid record; the first one that is not (a torn header, a unit that does not add up) ends
// the walk with bad() set, and the rest of the unit counts as that one bad record.
class UnitReader {
 public:
  struct Item {
    BlockHeader header;
    std::span<const std::byte> payload;
    uint32_t index = 0;  // position among the unit's records
  };

  explicit UnitReader(std::span<const std::byte> unit);
  bool next(Item* out);
  bool bad() const { return bad_; }
  HeaderError error() const { return error_; }
  bool packed() const { return packed_; }
  // Records the unit declares (1 unless packed); only meaningful when !bad() at the start.
  uint32_t declared() const { return declared_; }

 private:
  std::span<const std::byte> rest_;
  uint32_t left_ = 0;
  uint32_t index_ = 0;
  uint32_t declared_ = 0;
  bool packed_ = false;
  bool bad_ = false;
  HeaderError error_ = HeaderError::kNone;
};

// Signed distance from `expected` to `packet` in wrap-around arithmetic (RFC 1982 style).
inline int64_t packet_distance(uint32_t expected, uint32_t packet) { return static_cast<int32_t>(packet - expected); }

}  // namespace slotstream::wire
