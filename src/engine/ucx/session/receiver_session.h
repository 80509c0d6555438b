// One sender's connection on the receiver: the handshake (handshake.h), then the consumer loop
// that polls the sender's block region (paper §3.2.5), hands complete messages to its sink and
// watches its control socket. UCX's receiver engine (src/engine/ucx/receiver.h) accepts connections, owns what all
// sessions share (SessionHost) and decides which thread runs the loop.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/options.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/session/handshake.h"
#include "engine/ucx/stream/delivery.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream::session {

using Clock = std::chrono::steady_clock;

// The consumer's idle policy (ReceiverSession::consume, and the receiver's round-robin thread).
constexpr auto kSpinIdle = std::chrono::microseconds(200);
// Longest sleep at the zero-copy held limit before the session looks again (its socket, its FIN).
constexpr auto kLendWait = std::chrono::microseconds(1000);
constexpr auto kMinIdleSleep = std::chrono::microseconds(20);
constexpr auto kMaxIdleSleep = std::chrono::microseconds(1000);
// A sender idle for 100 ms or more (a camera that stopped, a once-a-second sensor, a quiet night)
// is looked at every 20 ms: hundreds of idle connections then cost ~nothing, and the first message
// after the pause waits at most that long. Streams with shorter gaps (a 25 fps camera: 40 ms) keep
// the ≤ 1 ms naps.
constexpr auto kLongIdle = std::chrono::milliseconds(100);
constexpr auto kLongIdleSleep = std::chrono::milliseconds(20);
// Idle this long, a session's own thread hands it to the receiver's idle loop (one thread for every
// idle session, looking at each every kLongIdleSleep as the thread did) and sleeps until it has work.
constexpr auto kParkAfter = kLongIdle;

// How long a consumer idle for `idle` sleeps before it looks again: an eighth of the idle time,
// at least kMinIdleSleep, at most kMaxIdleSleep (kLongIdleSleep once idle for kLongIdle).
inline Clock::duration idle_nap(Clock::duration idle) {
  const Clock::duration cap = idle > kLongIdle ? Clock::duration(kLongIdleSleep) : kMaxIdleSleep;
  return std::clamp<Clock::duration>(idle / 8, kMinIdleSleep, cap);
}

// A FIN may count only devices its connection declared: nullopt, or why not. Pure.
std::optional<std::string> check_fin(const wire::Fin& fin, const std::vector<uint16_t>& declared);
// Messages a FIN counts that were not stored: per device what it counts beyond `stored(device)`,
// summed without wrapping (at most UINT64_MAX): counts that would wrap 2^64 can never add up to
// "all stored". Pure.
uint64_t missing_messages(const wire::Fin& fin, const std::function<uint64_t(uint16_t)>& stored);

// UCX context + shared worker for one transport (shm, tcp or rdma), created when the first sender
// asks for it (rdma: the RDMA transport the receiver serves).
struct TransportFabric {
  // Shared: blocks lent to the application (zero-copy receive) keep it until they are released.
  std::shared_ptr<fabric::Context> context;
  std::unique_ptr<fabric::Worker> worker;
  std::unique_ptr<fabric::ProgressThread> progress;
};

// What a session needs from the receiver that accepted it (Receiver::Impl). Any thread.
class SessionHost {
 public:
  virtual ~SessionHost() = default;
  virtual const ReceiverOptions& receiver_options() const = 0;
  // What the receiver brings to the choice of transport (handshake.h), and the transports it
  // offers (wire::kOfferShm, kOfferRdma) for ACCEPT.
  virtual const ReceiverTerms& receiver_terms() const = 0;
  virtual uint8_t receiver_offers() const = 0;
  // The receiver is shutting down: every session ends.
  virtual bool is_stopping() const = 0;
  // Why, as Receiver::stop(reason) was given it ("" when not said). Any thread.
  virtual std::string stop_reason() const = 0;
  virtual wire::CapacityInfo capacity() = 0;
  // Admission of this connection (engine/ucx/session/admission.h): it sent bytes (its HELLO); it authenticated
  // (nullopt: go on, else why it is refused); it was closed to make room for others.
  virtual void spoke(uint64_t connection) = 0;
  virtual std::optional<std::string> authenticated(uint64_t connection) = 0;
  virtual bool evicted_for_room(uint64_t connection) = 0;
  // Takes the sender name for this connection's group (nullopt, *group set), or says why not.
  virtual std::optional<std::string> register_lane(const wire::Hello& hello, uint64_t* group) = 0;
  // A registered lane completed its handshake (READY sent): its sender counts as accepted.
  virtual void lane_accepted(uint64_t group) = 0;
  // A registered lane ended; reports the sender once all its lanes have — if any was accepted (a
  // sender refused after registering, e.g. for the memory budget, is no ended session).
  virtual void lane_ended(uint64_t group, const SessionReport& report) = 0;
  // Reserves `bytes` of the memory budget, or says why not.
  virtual std::optional<std::string> reserve_memory(uint64_t bytes) = 0;
  virtual void release_memory(uint64_t bytes) = 0;
  virtual Status transport_fabric(Transport transport, TransportFabric** out) = 0;
  // A session's live report (about every 100 ms) with its sender group; withdrawn when it ends.
  virtual void publish(const void* session, uint64_t group, const SessionReport& report) = 0;
  virtual void withdraw(const void* session) = 0;
  virtual void event(const std::string& text) = 0;
  // What needs someone to act (ReceiverOptions::on_warning).
  virtual void warning(const std::string& text) { event(text); }
  // A connection was refused (Receiver::refusals).
  virtual void count_refusal(const RefusalLabels& /*labels*/) {}
};

// One connection. Threading: open() and close() on the connection's own thread; the consumer
// loop (begin_consume + step, or consume) on one thread at a time — the same one, or the
// receiver's round-robin thread while the own thread waits.
class ReceiverSession {
 public:
  // `connection`: the receiver's id of this connection (SessionHost's admission calls).
  ReceiverSession(SessionHost& rx, uint64_t connection, std::unique_ptr<net::ControlSocket> control);

  // The handshake. false: nothing more to do — the sender was refused (REFUSE sent, everything
  // released), or the connection only asked for capacity. true: call close() once the loop ended.
  bool open();
  // The consumer loop: begin_consume(), then step() until it returns false (the session ended:
  // FIN answered, sender lost, or receiver stopping). One pass per step, so that one thread can
  // serve several sessions in turn (ReceiverOptions::round_robin); consume() is the thread per
  // sender with its idle policy.
  // `park`: called when the session has been idle for kParkAfter — it serves the session from
  // elsewhere (the receiver's idle loop) until a pass does something (true: go on here) or the
  // session ends (false); this thread meanwhile sleeps without waking.
  void consume(const std::function<bool()>& park);
  void begin_consume();
  bool step();
  bool worked() const { return loop_.worked; }
  // Reports the session, frees its region and tells the receiver it ended.
  void close();

 private:
  // --- handshake.cc. Returns a refusal to send, or nullopt when accepted. In order: read_hello,
  // check_hello, authenticate, set_up (allocates and sends ACCEPT), connect (SETUP -> READY).
  std::optional<Refusal> handshake();
  std::optional<Refusal> read_hello(wire::Hello* hello);
  std::optional<Refusal> authenticate(const wire::Hello& hello);
  std::optional<Refusal> set_up(const wire::Hello& hello);
  std::optional<Refusal> set_up_transport(uint64_t region);
  std::optional<Refusal> send_accept();
  std::optional<Refusal> connect();
  std::optional<Refusal> make_sink();
  void refuse(const Refusal& refusal);

  // --- receiver_session.cc: one pass of the consumer loop, by concern.
  bool drain_lost();  // the sender is gone: keep what is complete, end
  void tell_stopped();
  void lose_sender(const std::string& why);
  size_t deliver();  // delivery pass; a failing sink stalls the sender
  void stall(const Status& st);
  void unstall();
  bool fin_complete(size_t consumed);         // FIN answered: the session ends
  void check_control(Clock::time_point now);  // live report, liveness, FIN
  void on_pause(uint16_t device, bool paused);
  void note_lend_limit();
  void confirm_stored(Clock::time_point now);
  void send_stored();
  void control_frame(const wire::Frame& frame);
  void on_fin(const wire::Frame& frame);
  wire::Numbered on_number(const wire::Number& number);
  // The UCX worker this session's protocol uses: its own, or the transport's shared one.
  fabric::Worker& worker() { return own_worker_ ? *own_worker_ : *fabric_->worker; }
  void apply_holds(Clock::time_point start);
  void hold_all(bool held);
  bool can_park(Clock::time_point now) const;
  void fill_report(Clock::time_point start);
  void publish(Clock::time_point start);
  // What the live report shows that can change (counters, stalls, holds, pauses): an unchanged
  // one is not published again (idle sessions then cost no copying).
  std::vector<uint64_t> report_fingerprint() const;
  void free_region();

  SessionHost& rx_;
  const uint64_t connection_;
  const ReceiverOptions& rx_options_;
  std::unique_ptr<net::ControlSocket> control_;
  Clock::time_point opened_at_;
  // --hold-block's clock: from the sender's first data (the paper's Fig. 18 holds "at the 100-ms mark"
  // of the transmission; the bench's bins count from the first arrival too). Unset until then: a
  // window that starts at 0 is held from the start.
  Clock::time_point hold_clock_{};
  const protocol::Descriptor* desc_ = nullptr;
  protocol::Options options_;
  Transport transport_ = Transport::kShm;
  std::string transport_reason_;
  TransportFabric* fabric_ = nullptr;
  std::vector<uint8_t> hello_bytes_;    // as received: the authentication proofs cover them
  std::optional<net::Nonce> my_nonce_;  // set when the sender was challenged (token)
  net::Nonce sender_nonce_{};
  // Declared in the order they must be created; destroyed in reverse (protocol, then the
  // endpoint back to the sender, then the session's own worker).
  std::unique_ptr<fabric::Worker> own_worker_;   // Descriptor::receiver_progress
  std::unique_ptr<fabric::Endpoint> to_sender_;  // Descriptor::receiver_endpoint
  // Shared with the views of a zero-copy receiver (engine/ucx/stream/lending.h): they may outlive the session.
  std::shared_ptr<protocol::ReceiverProtocol> proto_;
  std::unique_ptr<MessageSink> sink_;
  stream::LendingSink* lender_ = nullptr;  // sink_, in zero-copy mode
  std::unique_ptr<stream::Delivery> delivery_;
  protocol::Geometry geometry_;
  SessionReport report_;
  bool registered_ = false;  // counted in its sender group (must report when it ends)
  bool held_all_ = false;
  bool capacity_only_ = false;  // the connection only asked for capacity
  uint64_t group_ = 0;
  uint64_t reserved_bytes_ = 0;  // of the receiver's memory budget, released when the session ends
  bool confirm_ = false;         // the sender asked for STORED (wire::kHelloConfirm)
  wire::Stored confirmed_;       // what the last STORED said
  // Per device, the messages delivered before its last NUMBER: STORED counts those after it.
  std::map<uint16_t, uint64_t> numbered_at_;
  Clock::time_point next_confirm_{};
  std::map<uint16_t, Clock::time_point> next_pause_log_;
  std::vector<bool> hold_active_;
  struct Loop {  // the consumer loop's state between passes
    Clock::time_point start, last_work, next_busy_log, next_publish, next_check, fin_deadline, retry_at, lost_at,
        next_limit_log;
    // When the current pass began: the one clock read of a pass (small messages are a pass each,
    // and a read costs ~25-50 ns in these VMs — five of them were a third of a 256 B message's cost).
    Clock::time_point now;
    std::optional<wire::Fin> fin;
    bool stalled = false;
    bool logged_stall = false;
    bool lend_limited = false;  // the application holds the most blocks it may (zero-copy)
    bool worked = false;        // the last pass consumed something or the protocol progressed
    std::string last_error;
    std::string lost;                 // why the sender is gone (set: drain after lost_at, then end)
    std::vector<uint64_t> published;  // report_fingerprint() of the last live report
  } loop_;
};

}  // namespace slotstream::session
