// One connection of a sender to the receiver (a lane): the sender's side of the handshake, the
// fabric it sets up from the receiver's ACCEPT, the send ring, the protocol, and the sending
// thread that owns the lane's UCX worker (paper §3.2.4). Most protocols use one lane for every
// device; one that cannot share a connection between devices (sliding window) gets one lane per
// device. UCX's sender engine (src/engine/ucx/sender.h) groups devices into lanes and owns what they share
// (LaneOwner); filler threads reach a lane only through DeviceStream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/options.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/stream/send_ring.h"
#include "net/control_socket.h"
#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream::session {

// The one error a sender reports when its receiver goes away mid-stream, whatever noticed it
// first — the control socket's EOF (shm: UCX itself never notices), the endpoint's transport error
// (tcp, rdma) or a protocol's failed put or read: "lost the receiver (HOW): ..." with what to do.
// The CLI, the Python binding and slotstreamsink's bus message all carry it.
Status receiver_lost(std::string_view how);
// A kPeerGone met while transmitting is the receiver's loss, said as receiver_lost() says it (a
// transport error on tcp, e.g. "Endpoint timeout", is how UCX reports a dead receiver). Anything
// else is returned as is.
Status explain_transmit_error(Status st);

// How long the sending thread waits for a filled block before its next idle turn: soonest while
// transfers are in flight (tcp puts, rendezvous sends: only their completion, which needs the
// worker progressed, frees a block for the fillers), soon while the protocol holds records back
// (SenderProtocol::holding_st: its idle_st() flushes them), ~1 ms otherwise, and 20 ms once
// nothing was transmitted for 100 ms (an idle connection then costs ~nothing).
std::chrono::microseconds sending_idle_period(bool in_flight, bool holding,
                                              std::chrono::steady_clock::duration since_activity);

// What a lane needs from its sender (Sender::Impl). Any thread.
class LaneOwner {
 public:
  virtual ~LaneOwner() = default;
  virtual const SenderOptions& sender_options() const = 0;
  virtual const protocol::Descriptor& descriptor() const = 0;
  virtual const protocol::Options& protocol_options() const = 0;
  // The UCX context every lane shares, created for the transport the first ACCEPT names; a
  // later lane that was given another transport is an error. Called during Sender::connect.
  virtual Status shared_context(const wire::Accept& accept, fabric::Context** out) = 0;
  // What the sender offers in its HELLO (wire::kOfferShm, kOfferRdma): less after a failure.
  virtual uint8_t offers() const = 0;
  // A receiver's ACCEPT arrived (which transport, and why). Called during Sender::connect.
  virtual void accepted(const wire::Accept& accept) = 0;
  // The lane's endpoint connected over these UCX lanes (fabric::Endpoint::lanes; rdma only).
  virtual void connected_over(const std::string& /*lanes*/) {}
  // This side could not set up `transport` (why: `st`). True: connect again offering less (an
  // auto sender; said on stderr by the CLI through transport_reason()); false: `st` is the error.
  virtual bool set_up_failed(Transport transport, const Status& st) = 0;
  // The first error of any lane ends the sender: every lane's ring is aborted.
  virtual void fail(Status st) = 0;
  virtual bool failed() const = 0;
  virtual Status first_error() = 0;
  // PAUSE from the receiver: a device's fillers wait (its worker is behind).
  virtual void set_paused(uint16_t device, bool paused) = 0;
  // Messages of `device` whose send() completed (for FIN).
  virtual uint64_t messages_sent(uint16_t device) = 0;
  // STORED from the receiver: what it has stored so far (SenderOptions::confirm_stored).
  virtual void on_stored(const wire::Stored& stored) = 0;
  // NUMBERED from the receiver: its answer to a NUMBER (Sender::continue_at).
  virtual void on_numbered(const wire::Numbered& answer) = 0;
};

class SenderLane {
 public:
  SenderLane(LaneOwner& owner, uint16_t index, std::vector<uint16_t> devices);

  // Opens the control connection and runs the handshake with `hello` (lane, devices, offers and
  // nonce filled in here); connects again, offering less, while the owner says so after a failed
  // set-up (LaneOwner::set_up_failed). Sender::connect's thread.
  Status connect(const std::string& host, uint16_t port, wire::Hello hello);
  // Starts the sending thread. Once, after connect() succeeded; stop() must join it before the
  // lane is destroyed.
  void start();
  // Asks the sending thread to transmit what is committed and end, then joins it. Any one thread.
  void stop();
  // Aborts the ring: fillers waiting for a block return. Any thread.
  void abort();
  // A filler published a record or committed a block and may have to transmit it (the lane was
  // idle when it reserved, or it committed a whole block): takes the transmit token if no one
  // holds it and transmits — at most a ring's worth, or until the receiver has no room, then the
  // sending thread takes over (engine/ucx/stream/send_ring.h). Also what a filler waiting for a block does.
  // `wait_whole`: a filler with no deadline, which waits for receiver room itself when the unit at
  // the cursor is a block claimed whole (drain_st). Filler threads.
  Status help(bool wait_whole = false);
  // After stop(): FIN, then waits until the receiver confirmed every message stored.
  Status fin();
  // NUMBER while data moves; the sending thread hands the answer to LaneOwner::on_numbered. Any
  // thread (one at a time; not with fin()).
  Status number(const wire::Number& number);

  const std::vector<uint16_t>& devices() const { return devices_; }
  stream::SendRing& ring() { return *ring_; }  // after connect()
  // The protocol, or nullptr before its set-up; its stats() only once stop() returned.
  protocol::SenderProtocol* protocol() { return proto_.get(); }
  // Records held back so far, for progress displays while sending. Any thread.
  uint64_t held_skips_live() const { return held_skips_live_.load(std::memory_order_relaxed); }
  // Records (messages and fragments) and units (what the protocol transmitted: blocks; several
  // records when packed) so far: only once stop() returned.
  uint64_t records() const { return records_; }
  uint64_t units() const { return units_; }
  // When the receiver last said anything on this connection (any frame; KEEPALIVE at least every
  // wire::kKeepaliveInterval). After connect(); any thread.
  std::chrono::steady_clock::time_point heard() const { return control_->last_received(); }

 private:
  // *failed: set when the chosen transport's set-up failed on this side (the receiver was told).
  Status handshake(const wire::Hello& hello, std::optional<Transport>* failed);
  Status read_first_stored();
  Status setup_fabric(const wire::Accept& accept);
  void refuse_transport(Transport transport, const Status& st);
  Status check_lanes() const;
  Status unreachable(const Status& st) const;
  void reset();  // back to before connect()
  // "_st": only whoever holds the ring's transmit token (protocol.h).
  // Transmits units from the cursor on (`budget` at most). A filler (`filler`) hands the lane to
  // the sending thread instead of waiting for receiver room — except for a block claimed whole
  // when `wait_whole` (it waits itself) — and once its budget is spent (`*handed`). The sending
  // thread waits for room without sealing the open block first, so that the records that arrive
  // meanwhile leave with it.
  Status drain_st(bool filler, bool wait_whole, size_t budget, size_t* sent, bool* handed);
  Status send_unit_st(const stream::SendRing::Unit& unit);
  Status reap_st();
  // The sending thread keeps the token for a moment after it moved packed units: fillers then
  // pack instead of transmitting themselves. True: work came.
  bool linger_st();
  // A filler's turn with the token ends (see .cc); returns the turn's status, explained.
  Status leave_token(Status st);
  Status sending_thread_st();
  void sending_loop_st();
  Status alive_st();
  // kPeerGone when the receiver has said nothing for longer than SenderOptions::stall_timeout (and
  // nothing waits to be read): stopped or hung. Whoever reads the control socket.
  Status check_silence(std::chrono::steady_clock::time_point now) const;
  // A control frame from the receiver while data moves (PAUSE, STORED; REFUSE: the receiver ends
  // the connection and says why).
  Status control_frame(const wire::Frame& frame);
  // The lane failed with `st`: if the receiver said why it ended the connection (REFUSE), that
  // instead. Token holder's.
  Status receiver_said_st(Status st);

  LaneOwner& owner_;
  const uint16_t index_;
  const std::vector<uint16_t> devices_;
  std::unique_ptr<net::ControlSocket> control_;
  std::unique_ptr<fabric::Worker> worker_;
  std::unique_ptr<fabric::Endpoint> endpoint_;
  std::unique_ptr<fabric::MemoryRegion> local_;
  std::unique_ptr<stream::SendRing> ring_;
  std::unique_ptr<protocol::SenderFabric> proto_fabric_;
  std::unique_ptr<protocol::SenderProtocol> proto_;
  std::thread sending_thread_;
  std::atomic<bool> finishing_{false};
  std::atomic<uint64_t> held_skips_live_{0};

  // Owned by whoever holds the ring's transmit token (the "_st" functions, protocol.h): the
  // worker, the protocol, and these.
  std::deque<std::pair<uint64_t, fabric::Request>> inflight_;  // (ticket, transfer), oldest first
  uint64_t transmitted_ = 0;
  uint64_t records_ = 0;
  uint64_t units_ = 0;
  bool packed_ = false;  // the sending thread's last turn sent a packed unit
  std::chrono::steady_clock::time_point next_liveness_{};
  std::atomic<bool> in_flight_{false};  // !inflight_.empty(), for a filler leaving the token
  // The sending thread saw transfers in flight at its last turn, so it comes back within
  // kInFlightPeriod by itself: a filler leaving some need not wake it (a futex per message).
  std::atomic<bool> watching_inflight_{false};
  bool needs_watcher() const {
    return in_flight_.load(std::memory_order_relaxed) && !watching_inflight_.load(std::memory_order_relaxed);
  }
};

}  // namespace slotstream::session
