// Control messages exchanged over the out-of-band TCP socket. The socket carries connection
// set-up, then stays open as a liveness signal (EOF = the peer is gone), for PAUSE and for the
// final FIN / FIN_ACK.
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
//          receiver -> STORED (only when HELLO asked for it: at once, then whenever counts moved; the
//                           sender reads the first one(s), covering each of its devices, as the
//                           handshake's end)
//          sender -> NUMBER ; receiver -> NUMBERED (any number, while data moves: a declared device
//                           starts again at a number of the sender's, e.g. back from being stored elsewhere)
//          receiver -> KEEPALIVE (while data moves, and after FIN until FIN_ACK: whenever it has sent
//                           no other frame for kKeepaliveInterval — a sender that hears nothing for its
//                           stall timeout takes the receiver as stopped or hung)
//          sender -> FIN (per-device message counts) ; receiver -> FIN_ACK once all is stored
// Or, instead of HELLO, a capacity query: CAPACITY_REQ ; receiver -> CAPACITY, then close.
//
// HELLO:     magic "SLST" | u16 version | str8 protocol | str16 protocol options ("k=v,k=v") |
//            u32 blocks | u32 block_size | u8 transport (0 auto, 1 shm, 2 tcp, 3 rdma) |
//            u8 rdma transport (0 the receiver's, 1 rc, 2 dc, 3 ud) | u8 offers | str8 host id |
//            str8 shm domain | str8 sender name | u16 n | n x u16 device | u64 group | u16 lane |
//            u16 lanes | u8 flags | (flags bit 0) n x u64 first message number | 32-byte sender nonce
//            (a sender whose protocol needs one connection per device opens `lanes`
//            connections with the same random `group`; each declares its own devices)
//            offers: bit 0 shm (the sender may use shared memory: cleared when its shm set-up
//            failed and it connects again), bit 1 rdma (it has a usable RDMA device); tcp always.
//            shm domain: common.h shm_domain(), what shared memory needs besides one host.
//            flags: bit 0 numbered — device i's first message is stored as number first[i] and a
//            number already stored is a duplicate (dropped, counted); without it the receiver
//            continues after the last message on disk. bit 1 confirm — the receiver sends STORED.
//            Other bits are refused. (The platform's senders, src/platform: a stream that moves
//            to another receiver keeps its numbers and sends again what was not confirmed.)
// CHALLENGE: 32-byte receiver nonce
// AUTH:      32-byte sender proof   (net/auth.h: an HMAC over the whole HELLO and both nonces)
// ACCEPT:    u8 transport (1 shm, 2 tcp, 3 rdma) | u8 rdma transport (0 unless rdma; 1 rc, 2 dc,
//            3 ud) | u8 offers (the receiver's, as HELLO's) | str16 why this transport |
//            blob32 worker address | blob32 protocol set-up |
//            blob8 receiver proof (empty without a token; else an HMAC over HELLO and this ACCEPT)
// SETUP:     blob32 worker address | blob32 protocol set-up | blob8 sender proof (as ACCEPT's)
// READY:     (empty)
// PAUSE:     u16 device | u8 paused (1: stop filling this device, 0: go on) — back-pressure for
//            one device whose worker is behind; the others keep flowing
// STORED:    u16 n | n x (u16 device, u64 first message number, u64 messages stored), devices
//            ascending — of this connection: messages first .. first + stored - 1 are on the
//            receiver's disk
// NUMBER:    u16 device | u64 number — the device's next message on this connection is stored as
//            `number` (never behind its last one). The sender sends it only while every message of the
//            device it sent on this connection is stored (STORED said so) and sends none of it until
//            the answer: the platform's edge moves one device onto a connection that stays open for the
//            others (src/platform), its numbers having gone on elsewhere meanwhile.
// NUMBERED:  u16 device | u64 number | u8 ok | str16 message — the answer, once applied (ok 1) or why
//            not (ok 0: the connection goes on, the device's numbering unchanged). After an ok answer,
//            STORED counts the device from `number`: first = number, stored = messages since.
// KEEPALIVE: (empty) — the receiver's process is alive and serves this connection (a receiver that
//            holds its blocks, its disk full, still sends it: back-pressure, not a hang)
// REFUSE:    u16 code | str16 message
// FIN:       u16 n | n x (u16 device, u64 messages)   (n <= kMaxDevices: one frame holds any FIN)
// FIN_ACK:   u8 ok | u64 messages stored | str16 message
// CAPACITY_REQ: magic "SLST" | u16 version
// CAPACITY:  u32 connected senders | u64 worker backlog bytes | u32 load (1-min load average per
//            CPU, x1000) | u64 free bytes in /dev/shm
//
// Either side may send REFUSE during set-up: the sender does so instead of SETUP when its half of
// the transport could not be set up (it may then connect again offering less).
//
// Signed frames (with a token, both ends): from the receiver's answer to SETUP on (READY or
// REFUSE, then PAUSE, STORED, KEEPALIVE, FIN, FIN_ACK), every frame either way is
//            u32 length | u8 type | body | u64 sequence | 32-byte MAC
//   MAC = net::mac(session key, "frame s>r" or "frame r>s", {u8 type, u64 sequence, body})
// (net/auth.h: the key is derived from the token and both handshake nonces, never sent). Each
// direction counts its frames from 0; a frame whose MAC or sequence number is not the expected one
// (forged, altered, replayed, reordered or reflected) ends the session. Without a token nothing is
// signed: nothing could be.
//
// A receiver refuses any other control version rather than guessing (no silent forward
// compatibility). Version 2 added protocol options, SETUP/READY and mutual authentication over
// the whole handshake; version 3 HELLO's flags and first message numbers, and STORED; version 4
// the rdma transport, the offers, the shm domain and ACCEPT's reason; version 5 says that blocks
// may hold packed units (a receiver of version 4 would count them as bad headers and lose
// their messages, so it must refuse the sender instead); version 6 adds signed frames after the
// handshake (a sender of version 5 would not sign them); version 7 adds NUMBER/NUMBERED (a
// receiver of version 6 would end the session at an unexpected frame); version 8 adds KEEPALIVE (a
// sender of version 7 would end the session at an unexpected frame, and a receiver of version 7 sends
// none, so a version 8 sender would take it as hung). The block header
// (wire/block_header.h) carries its own version.
#pragma once

#include <array>
#include <chrono>
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
inline constexpr uint16_t kProtocolVersion = 8;
// How often a receiver that has sent nothing else says it is alive (KEEPALIVE): a sender needs a
// few of them missed before it calls the receiver hung (SenderOptions::stall_timeout, at least 2 s).
inline constexpr std::chrono::milliseconds kKeepaliveInterval{1000};
inline constexpr size_t kMaxFrame = 64 * 1024;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
// What a signed frame carries after its body: u64 sequence | MAC.
inline constexpr size_t kFrameTrailer = 8 + kMacSize;
// Devices one connection may declare (HELLO); its FIN lists at most as many, and that FIN, signed,
// still fits one frame: the receiver can always be told the counts.
inline constexpr uint32_t kMaxDevices = 4096;
inline constexpr size_t kFinEntrySize = 2 + 8;
static_assert(1 + 2 + kMaxDevices * kFinEntrySize + kFrameTrailer <= kMaxFrame, "a FIN of every device fits one frame");
// A STORED of every device does not (18 bytes each): it is sent as several, each of at most this
// many devices (split_stored); the sender takes each device's entry on its own.
inline constexpr size_t kStoredEntrySize = 2 + 8 + 8;
inline constexpr size_t kMaxStoredDevices = (kMaxFrame - 1 - 2 - kFrameTrailer) / kStoredEntrySize;

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
  kNumber = 14,
  kNumbered = 15,
  kKeepalive = 16,
};

inline constexpr uint8_t kHelloNumbered = 1;  // HELLO flags (above)
inline constexpr uint8_t kHelloConfirm = 2;

// Transports on the wire: one byte, kAuto 0 (the sender lets the receiver choose), kShm 1, kTcp 2,
// kRdma 3 (slotstream::Transport; encode_transport/decode_transport are the only conversion).
uint8_t encode_transport(Transport t);
std::optional<Transport> decode_transport(uint8_t code);
// RDMA transports: one byte, 0 none/unset, rc 1, dc 2, ud 3. decode: nullopt for 0; false for an
// unknown code.
uint8_t encode_rdma_transport(std::optional<RdmaTransport> t);
bool decode_rdma_transport(uint8_t code, std::optional<RdmaTransport>* out);

// The transports an end offers besides tcp (HELLO, ACCEPT).
inline constexpr uint8_t kOfferShm = 1;
inline constexpr uint8_t kOfferRdma = 2;
inline constexpr uint8_t kOfferMask = kOfferShm | kOfferRdma;

struct Hello {
  uint16_t version = kProtocolVersion;
  std::string protocol;
  std::string options;  // protocol options, "key=value,..." (engine/ucx/protocol/options.h)
  uint32_t blocks = 0;
  uint32_t block_size = 0;
  Transport transport = Transport::kAuto;
  std::optional<RdmaTransport> rdma_transport;  // unset: whichever the receiver serves
  uint8_t offers = kOfferShm;
  std::string host_id;
  std::string shm_domain;
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
  std::optional<RdmaTransport> rdma_transport;  // set exactly when transport is rdma
  uint8_t offers = 0;
  std::string reason;  // why this transport (choose_transport), for the sender to say
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

struct Number {
  uint16_t device = 0;
  uint64_t number = 0;
};

struct Numbered {
  uint16_t device = 0;
  uint64_t number = 0;
  bool ok = false;
  std::string message;  // why not, when !ok
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
// `m` as STORED bodies of at most kMaxStoredDevices devices each (one for a small one).
std::vector<std::vector<uint8_t>> split_stored(const Stored& m);
std::vector<uint8_t> encode(const FinAck& m);
std::vector<uint8_t> encode(const Number& m);
std::vector<uint8_t> encode(const Numbered& m);
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
Status decode(std::span<const uint8_t> body, Number* out);
Status decode(std::span<const uint8_t> body, Numbered* out);
Status decode(std::span<const uint8_t> body, CapacityInfo* out);
Status decode_capacity_request(std::span<const uint8_t> body);
// KEEPALIVE has an empty body; anything in it is an error.
Status decode_keepalive(std::span<const uint8_t> body);

}  // namespace slotstream::wire
