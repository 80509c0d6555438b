// Control messages exchanged over the out-of-band TCP socket. The socket carries connection
// set-up, then stays open only as a liveness signal (EOF = the peer is gone) and for the final
// FIN / FIN_ACK.
//
// Frame:   u32 LE length (of type + body, 1..kMaxFrame) | u8 type | body
// Session: sender -> HELLO
//          receiver -> CHALLENGE (only with a token) ; sender -> AUTH
//          receiver -> ACCEPT | REFUSE
//          sender -> SETUP (its own worker address and protocol set-up: protocols whose receiver
//                           reaches into the sender's memory, e.g. buffered_read)
//          receiver -> READY | REFUSE
//          ... data moves over UCX ...
//          receiver -> PAUSE (any number, while data moves: one device's sink is busy)
//          receiver -> STORED (only when HELLO asked for it: at once, then whenever counts moved)
//          sender -> FIN (per-device message counts) ; receiver -> FIN_ACK once all is stored
// Or, instead of HELLO, a capacity query: CAPACITY_REQ ; receiver -> CAPACITY, then close.
//
// HELLO:     magic "SLST" | u16 version | str8 protocol | str16 protocol options ("k=v,k=v") |
//            u32 blocks | u32 block_size | u8 transport (0 auto, 1 shm, 2 tcp) | str8 host id |
//            str8 sender name | u16 n | n x u16 device | u64 group | u16 lane | u16 lanes |
//            u8 flags | (flags bit 0) n x u64 first message number | 32-byte sender nonce
//            (a sender whose protocol needs one connection per device opens `lanes`
//            connections with the same random `group`; each declares its own devices)
//            flags: bit 0 numbered — device i's first message is stored as number first[i] and a
//            number already stored is a duplicate (dropped, counted); without it the receiver
//            continues after the last message on disk. bit 1 confirm — the receiver sends STORED.
//            Other bits are refused. (The platform's senders, src/platform: a stream that moves
//            to another receiver keeps its numbers and sends again what was not confirmed.)
// CHALLENGE: 32-byte receiver nonce
// AUTH:      32-byte sender proof   (net/auth.h: an HMAC over the whole HELLO and both nonces)
// ACCEPT:    u8 transport (1 shm, 2 tcp) | blob32 worker address | blob32 protocol set-up |
//            blob8 receiver proof (empty without a token; else an HMAC over HELLO and this ACCEPT)
// SETUP:     blob32 worker address | blob32 protocol set-up | blob8 sender proof (as ACCEPT's)
// READY:     (empty)
// PAUSE:     u16 device | u8 paused (1: stop filling this device, 0: go on) — back-pressure for
//            one device whose worker is behind; the others keep flowing
// STORED:    u16 n | n x (u16 device, u64 first message number, u64 messages stored), devices
//            ascending — of this connection: messages first .. first + stored - 1 are on the
//            receiver's disk
// REFUSE:    u16 code | str16 message
// FIN:       u16 n | n x (u16 device, u64 messages)
// FIN_ACK:   u8 ok | u64 messages stored | str16 message
// CAPACITY_REQ: magic "SLST" | u16 version
// CAPACITY:  u32 connected senders | u64 worker backlog bytes | u32 load (1-min load average per
//            CPU, x1000) | u64 free bytes in /dev/shm
//
// A receiver refuses any other control version rather than guessing (no silent forward
// compatibility). Version 2 added protocol options, SETUP/READY and mutual authentication over
// the whole handshake; version 3 HELLO's flags and first message numbers, and STORED; the block header
// (wire/block_header.h) carries its own version.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"
#include "slotstream/status.h"

namespace slotstream::wire {

inline constexpr std::array<uint8_t, 4> kMagic = {'S', 'L', 'S', 'T'};
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kMaxFrame = 64 * 1024;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;

enum class MsgType : uint8_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kAccept = 4,
  kRefuse = 5,
  kFin = 6,
  kFinAck = 7,
  kCapacityRequest = 8,
  kCapacity = 9,
  kSetup = 10,
  kReady = 11,
  kPause = 12,
  kStored = 13,
};

inline constexpr uint8_t kHelloNumbered = 1;  // HELLO flags (above)
inline constexpr uint8_t kHelloConfirm = 2;

// Transports on the wire: one byte, kAuto 0 (the sender lets the receiver choose), kShm 1, kTcp 2
// (slotstream::Transport; encode_transport/decode_transport are the only conversion).
uint8_t encode_transport(Transport t);
std::optional<Transport> decode_transport(uint8_t code);

struct Hello {
  uint16_t version = kProtocolVersion;
  std::string protocol;
  std::string options;  // protocol options, "key=value,..." (protocol/options.h)
  uint32_t blocks = 0;
  uint32_t block_size = 0;
  Transport transport = Transport::kAuto;
  std::string host_id;
  std::string name;
  std::vector<uint16_t> devices;
  uint64_t group = 0;
  uint16_t lane = 0;
  uint16_t lanes = 1;
  uint8_t flags = 0;                        // kHelloNumbered | kHelloConfirm
  std::vector<uint64_t> first;              // with kHelloNumbered: one per device, in `devices` order
  std::array<uint8_t, kNonceSize> nonce{};  // the sender's, for the receiver's proof
};

struct Accept {
  Transport transport = Transport::kShm;
  std::vector<uint8_t> worker_address;
  std::vector<uint8_t> setup;  // protocol-specific (region addresses, packed keys)
  std::vector<uint8_t> proof;  // empty, or kMacSize bytes when the receiver has a token
};

// The sender's half of the set-up, after ACCEPT.
struct Setup {
  std::vector<uint8_t> worker_address;
  std::vector<uint8_t> setup;
  std::vector<uint8_t> proof;
};

struct Refuse {
  Code code = Code::kRefused;
  std::string message;
};

struct Fin {
  std::map<uint16_t, uint64_t> messages;  // per device
};

struct Pause {
  uint16_t device = 0;
  bool paused = false;
};

struct Stored {
  struct Device {
    uint64_t first = 0;   // the number the connection's first message of this device got
    uint64_t stored = 0;  // messages of this device stored on this connection
  };
  std::map<uint16_t, Device> devices;
};

struct FinAck {
  bool ok = false;
  uint64_t stored = 0;
  std::string message;
};

struct CapacityInfo {
  uint32_t senders = 0;
  uint64_t backlog_bytes = 0;
  uint32_t load_milli = 0;
  uint64_t shm_free_bytes = 0;
};

struct Frame {
  MsgType type;
  std::vector<uint8_t> body;
};

std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> body);

std::vector<uint8_t> encode(const Hello& m);
std::vector<uint8_t> encode(const Accept& m);
std::vector<uint8_t> encode(const Setup& m);
// The bytes a proof covers: the message's encoding without its proof field.
std::vector<uint8_t> signed_part(const Accept& m);
std::vector<uint8_t> signed_part(const Setup& m);
std::vector<uint8_t> encode(const Refuse& m);
std::vector<uint8_t> encode(const Fin& m);
std::vector<uint8_t> encode(const Pause& m);
std::vector<uint8_t> encode(const Stored& m);
std::vector<uint8_t> encode(const FinAck& m);
std::vector<uint8_t> encode(const CapacityInfo& m);
std::vector<uint8_t> encode_capacity_request();

// Decoders return a kProtocolError Status naming what is wrong (e.g. "bad magic").
Status decode(std::span<const uint8_t> body, Hello* out);
Status decode(std::span<const uint8_t> body, Accept* out);
Status decode(std::span<const uint8_t> body, Setup* out);
Status decode(std::span<const uint8_t> body, Refuse* out);
Status decode(std::span<const uint8_t> body, Fin* out);
Status decode(std::span<const uint8_t> body, Pause* out);
Status decode(std::span<const uint8_t> body, Stored* out);
Status decode(std::span<const uint8_t> body, FinAck* out);
Status decode(std::span<const uint8_t> body, CapacityInfo* out);
Status decode_capacity_request(std::span<const uint8_t> body);

}  // namespace slotstream::wire
