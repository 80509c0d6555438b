// The datagram transport's protocols, declared the way src/engine/ucx/protocol/protocol.h declares the block
// protocols: one Descriptor per protocol — what it is (its service and capabilities) and its
// operations — listed in one registry (registry.cc) that the CLI, the benchmark, the handshake, the
// session and the sender enumerate instead of switching on names or opcodes.
//
// Each protocol is one (service, placement) pair of the patent's stack:
//
//   write_record  UD + RDMA Write-Record (write_record.h): one-sided, unreliable, partial placement
//   dgram_send    UD + Send/Recv (send_recv.h): two-sided, unreliable, whole messages only
//   dgram_rd      RD + Send/Recv: reliable and in order per source (sequence, ack, credits,
//                 retransmission: llp/rd.h)
//   rd_write_record  RD + RDMA Write-Record: one-sided like write_record, every lost segment
//                 retransmitted by RD below the placement
//   dgram_rc      RC + RDMA Write, then a Send that says it is there (rc_write.h): the same RDMAP
//                 over a TCP stream (iWARP as standardised), the patent's comparison point
//
// A placement has two halves. The target's (Placement, one per session at the receiver): which
// device and message a data segment belongs to, where its bytes go, when a message is given up, and
// which device a finished message is of. The source's (Descriptor::data_header, ::notice): how the
// sender addresses a message's segments. The service below them (UD, RD's sequence layer, RC's TCP
// stream) is the session's and the sender's, chosen by the descriptor's flags.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/dgram/placement/placement.h"
#include "engine/dgram/wire/wire.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {

struct Hello;

// What a session's placement is made from: the accepted hello and the receiver's timer for it.
struct PlacementSpec {
  std::span<const uint16_t> devices;  // the hello's list: device i owns STags first_stag + i * ring ...
  uint32_t ring = 1;                  // STags (posted receives) per device
  uint64_t max_message = 0;           // a region's (receive buffer's) size
  uint32_t first_stag = 1;
  int64_t timeout_ns = 0;  // a message's timer (see Descriptor::reliable)
  bool idle = false;       // the timer measures silence (restarted by every new byte), not age
};

// The device and message a data segment belongs to, as its placement reads the header.
struct Located {
  uint16_t device = 0;
  uint32_t msn = 0;
  // The segment is part of a message the device's order accounts for (an RC Write is not: the Send
  // after it is). Only such segments are checked against the device's order and noted in it.
  bool ordered = true;
};

// Why a data segment cannot be placed: it is not this protocol's kind of segment (malformed), or it
// names no STag or queue of the session (unknown).
enum class Reject { kMalformed, kUnknown };

// The target half of a protocol, for one session. Threading: the receiver's network thread.
class Placement {
 public:
  virtual ~Placement() = default;
  // The segment's device and message; nullopt (and *why) if it cannot be placed.
  virtual std::optional<Located> locate(const SegmentHeader& h, Reject* why) const = 0;
  // Places a located segment; completions (its message's, or an older one it retired) go to *done.
  virtual Placed place(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done) = 0;
  // The device a finished message is handed over for; nullopt: it names no message (an RC Write whose
  // Send never came).
  virtual std::optional<uint16_t> device_of(const Completion& c) const = 0;
  // Ends every message whose timer has fired (Outcome::kIncomplete).
  virtual void expire(int64_t now_ns, std::vector<Completion>* out) = 0;
  // Moves every running timer to at least `deadline_ns` (the receiver held the sender back).
  virtual void extend_all(int64_t deadline_ns) = 0;
  virtual int64_t next_deadline() const = 0;  // INT64_MAX: no timer runs
  // STags or queues that have state: what has been allocated so far (tests, fuzzing).
  virtual size_t touched() const = 0;
};

// A Placement whose timers and state are one target's (TaggedTarget, ReceiveQueues), with the
// timeout and timer kind of its spec: what every placement forwards to its target, written once.
template <class Target>
class TimedPlacement : public Placement {
 public:
  void expire(int64_t now_ns, std::vector<Completion>* out) override { target_.expire(now_ns, out); }
  void extend_all(int64_t deadline_ns) override { target_.extend_all(deadline_ns); }
  int64_t next_deadline() const override { return target_.next_deadline(); }
  size_t touched() const override { return target_.touched(); }

 protected:
  explicit TimedPlacement(const PlacementSpec& s) : target_(s.timeout_ns, s.idle) {}
  Target target_;
};

// Where the sender puts message `msn` of a device (the source half's input).
struct MessageSlot {
  uint16_t device = 0;
  size_t index = 0;  // the device's position in the hello's list
  uint32_t msn = 0;
  uint32_t ring = 1;
  uint32_t first_stag = 0;  // from ACCEPT
  uint64_t length = 0;
};

// A segment the sender sends after a message's data to complete it (RC's Send).
struct Notice {
  SegmentHeader header;
  std::vector<std::byte> payload;
};

struct Descriptor {
  std::string_view name;
  std::string_view summary;
  Service service;  // of its data segments (and of its control messages when over_tcp)
  Opcode data_op;   // how message bytes travel: kWriteRecord, kSend or kWrite
  // Every segment comes (RD, RC): a message's timer measures silence, and the receiver holds the
  // sender back (RD credits, RC unread) instead of dropping what it cannot store yet.
  bool reliable = false;
  // RD's sequence layer runs below placement (engine/dgram/llp/rd.h): acks, credits, retransmission.
  bool sequenced = false;
  // An incomplete message can be kept (Write-Record: the target records which bytes are valid).
  bool partial = false;
  // Messages go into STag regions of ACCEPT's region length (the sender checks it covers its
  // largest message); without it, into posted receives.
  bool tagged = false;
  // One TCP stream per session (the receiver's TCP listener), not UDP datagrams.
  bool over_tcp = false;
  std::unique_ptr<Placement> (*make_placement)(const PlacementSpec& spec) = nullptr;
  // The header of a message's data segments, but for its service, offset and L (the sender's).
  SegmentHeader (*data_header)(const MessageSlot& m) = nullptr;
  // What follows a message's data, if anything (nullptr: nothing).
  std::optional<Notice> (*notice)(const MessageSlot& m) = nullptr;
};

// The registry: every datagram protocol, in the order --help and the benchmark list them.
std::span<const Descriptor* const> protocols();
const Descriptor* find_protocol(std::string_view name);
inline constexpr const char* kDefaultProtocol = kDefaultDatagramProtocol;
// The registry as the public ProtocolInfo (engine "dgram"): what slotstream::protocols() lists after
// the block protocols.
std::vector<ProtocolInfo> infos();

// The placement spec of an accepted hello under `d`: its timer is the UD message timeout, or the
// reliable services' silence timeout.
PlacementSpec placement_spec(const Descriptor& d, const Hello& h, uint32_t first_stag, int64_t message_timeout_ns,
                             int64_t reliable_timeout_ns);

}  // namespace slotstream::dgram
