// Session set-up and tear-down messages of the datagram transport. They travel as Sends on the
// reserved queue number kControlQueue (so they share the segment format, its CRC and its
// versioning), and over UDP they are repeated until answered: no control message is assumed to
// arrive (patent: "as control messages can be easily lost, an additional goal is to prevent the
// transmissions of such control messages with the exception of initial setup/negotiation, where
// it is unavoidable ... there must be a handshake between the source and target that
// establishes the acceptable STag, memory region length").
//
// Payload layouts (little-endian; str8 = u8 length + bytes):
//
//   HELLO    u8 1 | str8 protocol | str8 sender name | u32 STags per device (ring length)
//            | u64 largest message | u32 segment payload | u16 n | n x u16 device
//   ACCEPT   u8 2 | u32 receiver QP | u32 RD credits | u64 region length
//            | u16 n | n x (u16 device, u32 first STag)       (device d's ring: first .. first+K-1)
//   REFUSE   u8 3 | str8 reason
//   FIN      u8 4 | u16 n | n x (u16 device, u64 messages sent, u64 bytes sent)
//   FIN_ACK  u8 5 | u16 n | n x (u16 device, u64 complete, u64 partial kept, u64 incomplete
//            dropped, u64 lost, u64 valid bytes)
//
// The sender repeats HELLO until ACCEPT/REFUSE and FIN until FIN_ACK; the receiver answers a
// repeated HELLO or FIN with the same answer. Unknown types are an error (no silent forward
// compatibility).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace slotstream::dgram {

inline constexpr uint32_t kControlQueue = 0xFFFFFFFFu;

enum class ControlType : uint8_t { kHello = 1, kAccept = 2, kRefuse = 3, kFin = 4, kFinAck = 5 };

struct Hello {
  std::string protocol;
  std::string name;
  uint32_t ring = 0;  // STags (message slots) per device
  uint64_t max_message = 0;
  uint32_t segment_size = 0;
  std::vector<uint16_t> devices;
  bool operator==(const Hello&) const = default;
};

struct Accept {
  uint32_t receiver_qp = 0;
  uint32_t credits = 0;
  uint64_t region_length = 0;
  struct Ring {
    uint16_t device = 0;
    uint32_t first_stag = 0;
    bool operator==(const Ring&) const = default;
  };
  std::vector<Ring> rings;
  bool operator==(const Accept&) const = default;
};

struct Refuse {
  std::string reason;
  bool operator==(const Refuse&) const = default;
};

struct Fin {
  struct Device {
    uint16_t device = 0;
    uint64_t messages = 0;
    uint64_t bytes = 0;
    bool operator==(const Device&) const = default;
  };
  std::vector<Device> devices;
  bool operator==(const Fin&) const = default;
};

// What the receiver made of each device's messages (every message sent is exactly one of
// complete, partial kept, incomplete dropped or lost).
struct DeliveryCounts {
  uint64_t complete = 0;
  uint64_t partial = 0;
  uint64_t dropped = 0;
  uint64_t lost = 0;
  uint64_t valid_bytes = 0;
  bool operator==(const DeliveryCounts&) const = default;
};

struct FinAck {
  struct Device {
    uint16_t device = 0;
    DeliveryCounts counts;
    bool operator==(const Device&) const = default;
  };
  std::vector<Device> devices;
  bool operator==(const FinAck&) const = default;
};

std::vector<uint8_t> encode_control(const Hello& m);
std::vector<uint8_t> encode_control(const Accept& m);
std::vector<uint8_t> encode_control(const Refuse& m);
std::vector<uint8_t> encode_control(const Fin& m);
std::vector<uint8_t> encode_control(const FinAck& m);

// The type of a control payload, or nullopt if empty/unknown.
std::optional<ControlType> control_type(std::span<const uint8_t> payload);
// Each returns nullopt unless the payload is exactly one well-formed message of that type.
std::optional<Hello> decode_hello(std::span<const uint8_t> payload);
std::optional<Accept> decode_accept(std::span<const uint8_t> payload);
std::optional<Refuse> decode_refuse(std::span<const uint8_t> payload);
std::optional<Fin> decode_fin(std::span<const uint8_t> payload);
std::optional<FinAck> decode_fin_ack(std::span<const uint8_t> payload);

}  // namespace slotstream::dgram
