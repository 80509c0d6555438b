// Session set-up and tear-down messages of the datagram transport. They travel as Sends on the
// reserved queue number kControlQueue (so they share the segment format, its CRC and its
// versioning), and over UDP they are repeated until answered: no control message is assumed to
// arrive (patent: "as control messages can be easily lost, an additional goal is to prevent the
// transmissions of such control messages with the exception of initial setup/negotiation, where
// it is unavoidable ... there must be a handshake between the source and target that
// establishes the acceptable STag, memory region length").
//
// Payload layouts (little-endian; str8 = u8 length + bytes; nonces and proofs are 32 bytes):
//
//   HELLO     u8 1 | u8 flags (1: the sender has a token and will authenticate) | str8 protocol
//             | str8 sender name | u32 STags per device (ring length) | u64 largest message
//             | u32 segment payload | u16 n | n x u16 device (no repeats) | nonce Ns
//             | u16 p | p x 0 (padding: see below)
//   ACCEPT    u8 2 | u32 receiver QP | u32 RD credits | u64 region length | u32 first STag
//             | u16 n (the HELLO's device count) | u8 k (0, or 32 with a token) | k bytes of proof
//             Device i of the HELLO's list has the ring of STags first + i*K .. first + i*K + K - 1.
//   REFUSE    u8 3 | str8 reason
//   FIN       u8 4 | u16 devices in all | u16 first | u16 n | n x (u16 device, u64 messages sent,
//             u64 bytes sent) | u16 p | p x 0
//   FIN_ACK   u8 5 | u16 devices in all | u16 first | u16 n | n x (u16 device, u64 complete,
//             u64 partial kept, u64 incomplete dropped, u64 lost, u64 valid bytes)
//   CHALLENGE u8 6 | nonce Nr
//   AUTH      u8 7 | nonce Nr | u16 length | the HELLO payload as sent | proof
//   ANNOUNCE  u8 8 | u32 first STag | u16 length | a HELLO payload (flags 0, nonce 0, no padding)
//
// FIN and FIN_ACK travel in parts of at most kFinPartDevices devices, each covering the HELLO's
// devices first .. first + n - 1, so that any device count fits in datagrams (and in the 16-bit
// frames over TCP); FIN_ACK part i answers FIN part i. With a token, HELLO is answered by a
// CHALLENGE and the session starts only after AUTH has proved the token (engine/dgram/wire/auth.h).
//
// A request is never answered by more bytes than it carried before the sender is authenticated
// (no amplification for a forged source address): a HELLO is padded to kHelloPaddedSize bytes,
// room for a readable REFUSE; a FIN part to the size of its FIN_ACK part (fin_padding()). The
// receiver cuts a REFUSE to fit and does not answer a request too small for its answer.
//
// The sender repeats HELLO until CHALLENGE/ACCEPT/REFUSE, AUTH until ACCEPT/REFUSE and FIN parts
// until their FIN_ACK parts; the receiver answers a repeated request with the same answer. Unknown
// types are an error (no silent forward compatibility); the layouts are wire version 2's
// (engine/dgram/wire/wire.h).
//
// ANNOUNCE starts a multicast session: a sender to an IP multicast group cannot shake hands
// with receivers it does not know, and a group has no one to ACCEPT. So it announces what a HELLO
// would ask and what an ACCEPT would grant (its STags: device i's ring is first + i*K ...) to the
// group, three times before its first segment and every 200 ms while it sends (a receiver that joins
// late starts at the next one), and ends with its FIN parts, five times, answered by no one. A
// receiver listening on the group (`recv --listen GROUP:PORT`) opens a session for an ANNOUNCE it
// accepts (a UD protocol, within its limits and budget; nothing is sent back), keyed like any UDP
// session by the sender's address and QP, and accounts for it on its own. Only UD protocols
// (write_record, dgram_send) announce; without a handshake there is no token either.
//
// TERMINATE is not a control-queue Send but RDMAP's own message (opcode 7, RFC 5040 §4.8):
// an untagged segment on queue number kTerminateQueue (2, RFC 5040's), MSN the sender's count of
// TERMINATEs, MO 0, L set; over UDP with service UD even in an RD session (it is not sequenced: the
// session it ends will retransmit nothing), over TCP RC; signed like any datagram of an authenticated
// session (an unsigned one is then ignored). Its payload:
//
//   TERMINATE u8 layer (0 RDMAP, 1 DDP, 2 LLP: where the error was found, RFC 5040's Layer)
//             | u8 code (TerminateCode: 1 protocol, 2 placement, 3 crc, 4 handshake, 5 aborted)
//             | str8 reason (UTF-8, for people: what was wrong, what to do)
//
// The side that detects a protocol error — a segment whose opcode or service the session's protocol
// does not use, a placement outside its STags, queues or regions, more datagrams failing their CRC
// than passing it, an ACCEPT the sender cannot honour — or that stops early on an error of its own
// sends TERMINATE and ends the session; the peer reports the reason and stops too. Over UDP it may be
// lost: the receiver answers a terminated session's later datagrams with it again (at most every
// 100 ms, for 10 s). Unknown layers or codes are malformed (no silent forward compatibility).
//
// ANNOUNCE and TERMINATE's payload are part of wire version 2: a peer without them misreads neither
// (an ANNOUNCE is an unknown control type to it, a TERMINATE an opcode it does not act on: both are
// dropped), so they need no version of their own.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

inline constexpr uint32_t kControlQueue = 0xFFFFFFFFu;
inline constexpr uint32_t kTerminateQueue = 2;  // RFC 5040 §5.1: queue 2 is the Terminate queue
inline constexpr size_t kDgramNonceSize = 32;
inline constexpr size_t kDgramProofSize = 32;
using DgramNonce = std::array<uint8_t, kDgramNonceSize>;
// Devices per FIN / FIN_ACK part: a FIN_ACK part is then 2.7 KB, two Ethernet frames.
inline constexpr size_t kFinPartDevices = 64;
// A HELLO's payload is padded to this many bytes (see above).
inline constexpr size_t kHelloPaddedSize = 256;
// Devices a HELLO may list: what fits one datagram, and the block receiver's limit.
inline constexpr size_t kMaxHelloDevices = 4096;

enum class ControlType : uint8_t {
  kHello = 1,
  kAccept = 2,
  kRefuse = 3,
  kFin = 4,
  kFinAck = 5,
  kChallenge = 6,
  kAuth = 7,
  kAnnounce = 8,
};

inline constexpr uint8_t kHelloAuth = 1;  // HELLO flags

struct Hello {
  uint8_t flags = 0;
  std::string protocol;
  std::string name;
  uint32_t ring = 0;  // STags (message slots) per device
  uint64_t max_message = 0;
  uint32_t segment_size = 0;
  std::vector<uint16_t> devices;
  DgramNonce nonce{};
  uint16_t padding = 0;  // zero bytes at the end
  bool auth() const { return flags & kHelloAuth; }
  bool operator==(const Hello&) const = default;
};

struct Accept {
  uint32_t receiver_qp = 0;
  uint32_t credits = 0;
  uint64_t region_length = 0;
  uint32_t first_stag = 0;
  uint16_t devices = 0;
  std::vector<uint8_t> proof;  // empty, or kDgramProofSize bytes
  bool operator==(const Accept&) const = default;
};

struct Refuse {
  std::string reason;
  bool operator==(const Refuse&) const = default;
};

struct Challenge {
  DgramNonce nonce{};
  bool operator==(const Challenge&) const = default;
};

struct Auth {
  DgramNonce receiver_nonce{};
  std::vector<uint8_t> hello;  // the HELLO payload as the sender sent it
  std::array<uint8_t, kDgramProofSize> proof{};
  bool operator==(const Auth&) const = default;
};

struct Announce {
  uint32_t first_stag = 1;
  Hello hello;  // flags 0
  bool operator==(const Announce&) const = default;
};

struct Fin {
  struct Device {
    uint16_t device = 0;
    uint64_t messages = 0;
    uint64_t bytes = 0;
    bool operator==(const Device&) const = default;
  };
  uint16_t total = 0;  // devices of the session
  uint16_t first = 0;  // index (in the HELLO's list) of devices[0]
  std::vector<Device> devices;
  uint16_t padding = 0;
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
  uint16_t total = 0;
  uint16_t first = 0;
  std::vector<Device> devices;
  bool operator==(const FinAck&) const = default;
};

// The padding a FIN part of n devices carries so that it is at least as long as its FIN_ACK part.
inline uint16_t fin_padding(size_t n) { return static_cast<uint16_t>(n * (42 - 18)); }  // entry sizes

enum class TerminateLayer : uint8_t { kRdmap = 0, kDdp = 1, kLlp = 2 };
enum class TerminateCode : uint8_t {
  kProtocol = 1,   // an opcode or service the session's protocol does not use
  kPlacement = 2,  // a segment outside the session's STags or queues, or beyond its region
  kCrc = 3,        // more of the session's datagrams failed their CRC32C than passed it
  kHandshake = 4,  // an answer of the handshake the peer cannot honour
  kAborted = 5,    // the peer stopped before the end of the session, on an error of its own
};
const char* terminate_code_name(TerminateCode c);

struct Terminate {
  TerminateLayer layer = TerminateLayer::kRdmap;
  TerminateCode code = TerminateCode::kProtocol;
  std::string reason;  // at most 255 bytes travel
  bool operator==(const Terminate&) const = default;
};
std::vector<uint8_t> encode_terminate(const Terminate& m);
// nullopt unless the payload is exactly one well-formed TERMINATE with a known layer and code.
std::optional<Terminate> decode_terminate(std::span<const uint8_t> payload);
// The header of a TERMINATE segment (the caller sets source_qp, and the MAC when signing).
SegmentHeader terminate_header(bool over_tcp, uint32_t msn);
// "code: reason", as both ends print it.
std::string describe(const Terminate& t);

std::vector<uint8_t> encode_control(const Hello& m);
std::vector<uint8_t> encode_control(const Accept& m);
std::vector<uint8_t> encode_control(const Refuse& m);
std::vector<uint8_t> encode_control(const Fin& m);
std::vector<uint8_t> encode_control(const FinAck& m);
std::vector<uint8_t> encode_control(const Challenge& m);
std::vector<uint8_t> encode_control(const Auth& m);
std::vector<uint8_t> encode_control(const Announce& m);

// The type of a control payload, or nullopt if empty/unknown.
std::optional<ControlType> control_type(std::span<const uint8_t> payload);
// Each returns nullopt unless the payload is exactly one well-formed message of that type.
std::optional<Hello> decode_hello(std::span<const uint8_t> payload);
std::optional<Accept> decode_accept(std::span<const uint8_t> payload);
std::optional<Refuse> decode_refuse(std::span<const uint8_t> payload);
std::optional<Fin> decode_fin(std::span<const uint8_t> payload);
std::optional<FinAck> decode_fin_ack(std::span<const uint8_t> payload);
std::optional<Challenge> decode_challenge(std::span<const uint8_t> payload);
std::optional<Auth> decode_auth(std::span<const uint8_t> payload);
std::optional<Announce> decode_announce(std::span<const uint8_t> payload);

}  // namespace slotstream::dgram
