// One datagram sender's session at the receiver (dgram/receiver.h): its devices, the placement of
// its segments (dgram/tagged.h, dgram/recv_queue.h; RD's sequence layer dgram/rd.h first), the
// in-order hand-over of each device's messages (dgram/device_order.h), its FIN and FIN_ACK parts and
// its report. No sockets and no clock of its own: the receiver passes it decoded segments (their MAC
// already checked) and the time, and sends what it asks for. Unit-tested (tests/dgram/session_test.cc)
// and fuzzed (fuzz/dgram_session_fuzz.cc).
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
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "dgram/control.h"
#include "dgram/device_order.h"
#include "dgram/placement.h"
#include "dgram/protocols.h"
#include "dgram/rd.h"
#include "dgram/recv_queue.h"
#include "dgram/report.h"
#include "dgram/tagged.h"
#include "dgram/wire.h"

namespace slotstream::dgram {

class Session {
 public:
  struct Config {
    const Protocol* protocol = nullptr;
    Hello hello;                                   // checked (handshake.h check_hello)
    uint32_t first_stag = 1;                       // STag 0 names nothing
    int64_t message_timeout_ns = 200'000'000;      // UD
    int64_t reliable_timeout_ns = 30'000'000'000;  // RD, RC: silence within a message
    uint32_t rd_window = 512;
  };
  explicit Session(Config c);

  const Hello& hello() const { return c_.hello; }
  const Protocol& protocol() const { return *c_.protocol; }
  bool reliable() const { return c_.protocol->service != Service::kUD; }
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

  struct Ready {
    uint16_t device = 0;
    uint32_t msn = 0;
    bool partial = false;
    Completion completion;
  };
  // Fires timers and hands over, per device and in MSN order, the messages that are ready for the
  // store; lost and dropped ones are only counted. `room`: bytes the store queue may still take; an
  // unreliable session's complete messages beyond it are dropped (and counted); what is handed
  // over is taken from it. Partial Write-Record messages are kept only with keep_partial.
  void release(int64_t now_ns, bool keep_partial, uint64_t* room, std::vector<Ready>* out);
  int64_t next_deadline() const;  // INT64_MAX: nothing to wait for

  // The FIN_ACK part that answers FIN part `first` (the devices first .. first + kFinPartDevices - 1).
  FinAck fin_ack_part(uint16_t first) const;
  std::vector<FinAck> fin_ack_parts() const;

  DatagramCounters& counters() { return counters_; }
  const DatagramCounters& counters() const { return counters_; }
  std::map<uint16_t, DeviceReport> device_reports() const;
  // A segment of a message was placed (the sender is not only saying hello).
  bool carried_data() const { return carried_data_; }
  // Devices and STags with state: what has been allocated so far (tests, fuzzing).
  size_t devices_with_state() const { return devices_.size(); }
  size_t stags_touched() const { return tagged_.touched(); }

 private:
  struct DeviceState {
    explicit DeviceState(int64_t timeout) : order(timeout) {}
    DeviceOrder order;
    DeviceReport report;
  };
  std::optional<size_t> index_of(uint16_t device) const;
  std::optional<uint16_t> device_of_stag(uint32_t stag) const;
  DeviceState& device(uint16_t d);
  void on_rd(const Segment& seg, std::span<const std::byte> datagram, int64_t now_ns);
  void place(const Segment& seg, int64_t now_ns);
  void place_tagged(const Segment& seg, int64_t now_ns, std::vector<Completion>* done);
  void place_send(const Segment& seg, int64_t now_ns, std::vector<Completion>* done);
  bool admit(uint16_t device, uint32_t msn);
  void count_placed(Placed p, size_t bytes);
  void finish(std::vector<Completion>& done, int64_t now_ns);
  void hand_over(uint16_t device, DeviceState& st, DeviceOrder::Release& r, bool keep_partial, uint64_t* room,
                 std::vector<Ready>* out);

  Config c_;
  std::vector<std::pair<uint16_t, uint16_t>> index_;  // (device, its index in the hello), sorted
  TaggedTarget tagged_;
  ReceiveQueues queues_;
  std::map<uint16_t, DeviceState> devices_;
  std::optional<RdReceiver> rd_;
  bool ack_due_ = false;
  uint32_t credits_granted_;
  bool backpressure_ = false;
  std::vector<bool> fin_seen_;
  size_t fin_known_ = 0;
  bool carried_data_ = false;
  DatagramCounters counters_;
};

}  // namespace slotstream::dgram
