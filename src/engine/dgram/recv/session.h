// One datagram sender's session at the receiver (engine/dgram/recv/receiver.h): its devices, the placement of
// its segments (the protocol's Placement, engine/dgram/protocol/protocol.h; RD's sequence layer engine/dgram/llp/rd.h
// first), the in-order hand-over of each device's messages (engine/dgram/recv/device_order.h), its FIN and FIN_ACK
// parts and its accounting. No sockets and no clock of its own: the receiver passes it decoded segments (their MAC
// already checked) and the time, and sends what it asks for. Unit-tested (tests/engine/dgram/recv/session_test.cc) and
// fuzzed (fuzz/dgram_session_fuzz.cc).
//
// Allocation follows the data, never the hello: a device's state appears with its first segment (or a
// FIN entry announcing messages), an STag's record with the first segment written to it, a message's
// buffer with its first bytes. The most all of that can reach is what handshake.h's
// reservation_bytes() charged against the receiver's budget.
//
// Timers: over UD a message is given up `message_timeout` after its first segment (the patent's
// rule). Over RD and RC every segment comes unless the sender is gone, so a message is given up after
// `reliable_timeout` without a new byte, and not at all while the receiver holds the sender back
// (set_backpressure): a dead or hostile sender cannot pin memory, a slow disk loses nothing.
// Threading: the receiver's network thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/dgram/llp/rd.h"
#include "engine/dgram/placement/placement.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/recv/device_order.h"
#include "engine/dgram/recv/report.h"
#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

class Session {
 public:
  struct Config {
    const Descriptor* protocol = nullptr;
    Hello hello;                                   // checked (handshake.h check_hello)
    uint32_t first_stag = 1;                       // STag 0 names nothing
    int64_t message_timeout_ns = 200'000'000;      // UD
    int64_t reliable_timeout_ns = 30'000'000'000;  // RD, RC: silence within a message
    uint32_t rd_window = 512;
    bool keep_partial = false;  // incomplete Write-Record messages are handed over as partial ones
  };
  explicit Session(Config c);

  const Hello& hello() const { return c_.hello; }
  const Descriptor& protocol() const { return *c_.protocol; }
  bool reliable() const { return c_.protocol->reliable; }
  // ACCEPT (without a proof): device i's STags are first_stag + i * ring ...
  Accept accept(uint32_t receiver_qp) const;

  // A datagram of this session that is not a control message. `datagram` is its bytes (RD keeps a
  // copy of one that arrives ahead of a hole).
  void on_segment(const Segment& seg, std::span<const std::byte> datagram, int64_t now_ns);
  // A FIN part. False (counted as malformed) unless it matches the hello's device list and every
  // count fits a session (at most 2^32 - 1 messages per device).
  bool on_fin(const Fin& part, int64_t now_ns);
  bool fin_complete() const { return fin_known_ == c_.hello.devices.size(); }
  // FIN complete and every message of every device accounted for.
  bool all_released() const;

  // While on, RD grants no credits and reliable messages' timers stand still.
  void set_backpressure(bool on, int64_t now_ns);
  // RD: the acknowledgement to send now, if one is due (data or a probe arrived, or the credits
  // changed). Counts it.
  std::optional<RdFields> take_ack();
  // `recv --hold-block`: while held, message slot `slot` of every device (STag ring[d][slot], or the
  // `slot`th receive: the messages whose MSN % ring is `slot`) is not handed over, and each device's
  // later messages wait behind it — the paper's held block, as a protocol without per-block status
  // keeps it (unprocessed). Slots past the ring are ignored.
  void hold(uint32_t slot, bool held);
  size_t held_slots() const;

  struct Ready {
    uint16_t device = 0;
    uint32_t msn = 0;
    bool partial = false;
    Completion completion;
  };
  // What the store can take now (the receiver's store queue, engine/dgram/recv/store_queue.h).
  struct Room {
    uint64_t bytes = UINT64_MAX;  // an unreliable session's complete messages beyond it are dropped
    // Whether a device's store is paused (its worker is behind): an unreliable session drops that
    // device's messages (a reliable one is held back by the receiver instead, and hands them over).
    std::function<bool(uint16_t)> paused;
  };
  // Fires timers and hands over, per device and in MSN order, the messages that are ready for the
  // store; lost and dropped ones are only counted. What is handed over is taken from room.bytes.
  void release(int64_t now_ns, Room& room, std::vector<Ready>* out);
  int64_t next_deadline() const;  // INT64_MAX: nothing to wait for

  // The FIN_ACK part that answers FIN part `first` (the devices first .. first + kFinPartDevices - 1).
  FinAck fin_ack_part(uint16_t first) const;
  std::vector<FinAck> fin_ack_parts() const;

  DatagramCounters& counters() { return counters_; }
  const DatagramCounters& counters() const { return counters_; }
  // Per device that carried data (or was in a FIN): what became of its messages.
  std::map<uint16_t, DeviceAccount> device_accounts() const;
  // A protocol error of the sender's (engine/dgram/wire/control.h TERMINATE): the first segment with a valid CRC that
  // its protocol cannot take (an opcode or service it does not use, an STag or queue not the session's,
  // bytes beyond a region or a message's end), or more CRC failures than good datagrams once there are
  // kCrcTerminateMin of them. The receiver then sends TERMINATE and ends the session. nullopt: none.
  std::optional<Terminate> protocol_error() const;
  static constexpr uint64_t kCrcTerminateMin = 64;
  // A segment of a message was placed (the sender is not only saying hello).
  bool carried_data() const { return carried_data_; }
  // Devices and STags with state: what has been allocated so far (tests, fuzzing).
  size_t devices_with_state() const { return devices_.size(); }
  size_t stags_touched() const { return placement_->touched(); }

 private:
  struct DeviceState {
    explicit DeviceState(int64_t timeout) : order(timeout) {}
    DeviceOrder order;
    DeviceAccount account;
    std::deque<DeviceOrder::Release> waiting;  // released by the order, not yet handed over (holds)
  };
  DeviceState& device(uint16_t d);
  void on_rd(const Segment& seg, std::span<const std::byte> datagram, int64_t now_ns);
  void place(const Segment& seg, int64_t now_ns);
  bool admit(uint16_t device, uint32_t msn);
  void violated(TerminateLayer layer, TerminateCode code, std::string why);
  void check_placed(Placed p, const Segment& seg, const Located& at);
  void count_placed(Placed p, size_t bytes, uint16_t device);
  void finish(std::vector<Completion>& done, int64_t now_ns);
  bool withheld(const DeviceOrder::Release& r) const;
  void hand_over(uint16_t device, DeviceState& st, DeviceOrder::Release& r, Room& room, std::vector<Ready>* out);

  Config c_;
  std::unique_ptr<Placement> placement_;
  std::map<uint16_t, DeviceState> devices_;
  std::optional<RdReceiver> rd_;
  bool ack_due_ = false;
  uint32_t credits_granted_;
  bool backpressure_ = false;
  std::vector<bool> holds_;  // by slot (recv --hold-block)
  std::vector<bool> fin_seen_;
  size_t fin_known_ = 0;
  bool carried_data_ = false;
  std::optional<Terminate> violation_;  // the first protocol error (protocol_error())
  DatagramCounters counters_;
};

}  // namespace slotstream::dgram
