// The receiver's session: its life (open, close) and the consumer loop, one concern per function.
// The handshake steps are in handshake.cc.
#include "engine/ucx/session/receiver_session.h"

#include <thread>

#include "sink/dir_sink.h"

namespace slotstream::session {

using net::Millis;

namespace {

constexpr Millis kStallRetry{100};
// After FIN, how long the receiver waits for blocks it was told about before calling them lost.
constexpr Millis kFinGrace{1000};
// After a sender died, let the progress thread apply what already arrived before the last drain.
constexpr Millis kLostGrace{50};
constexpr auto kBusyLogInterval = std::chrono::seconds(10);
constexpr Millis kIdleCheck{100};
// How often a sender that asked for confirmations hears what is stored (when something moved):
// what it must keep for sending again if this receiver dies is about this much of its stream.
constexpr Millis kConfirmInterval{50};
// The longest stop reason told to a sender (REFUSE; a frame holds 64 KiB).
constexpr size_t kMaxStopReason = 2000;

}  // namespace

std::optional<std::string> check_fin(const wire::Fin& fin, const std::vector<uint16_t>& declared) {
  for (const auto& [device, count] : fin.messages) {
    if (std::find(declared.begin(), declared.end(), device) == declared.end()) {
      return "FIN counts device " + std::to_string(device) + ", which this connection did not declare";
    }
  }
  return std::nullopt;
}

uint64_t missing_messages(const wire::Fin& fin, const std::function<uint64_t(uint16_t)>& stored) {
  uint64_t missing = 0;
  for (const auto& [device, count] : fin.messages) {
    const uint64_t got = stored(device);
    const uint64_t gap = count > got ? count - got : 0;
    missing = gap > UINT64_MAX - missing ? UINT64_MAX : missing + gap;
  }
  return missing;
}

ReceiverSession::ReceiverSession(SessionHost& rx, uint64_t connection, std::unique_ptr<net::ControlSocket> control)
    : rx_(rx),
      connection_(connection),
      rx_options_(rx.receiver_options()),
      control_(std::move(control)) {
  report_.sender.peer = control_->peer();
}

bool ReceiverSession::open() {
  opened_at_ = Clock::now();
  if (auto refusal = handshake()) {
    refuse(*refusal);
    return false;
  }
  if (capacity_only_) return false;
  rx_.lane_accepted(group_);
  return true;
}

void ReceiverSession::close() {
  fill_report(opened_at_);
  rx_.withdraw(this);
  // Free this sender's region before anyone hears that it has ended.
  free_region();
  control_.reset();
  rx_.release_memory(reserved_bytes_);
  rx_.lane_ended(group_, report_);
}

void ReceiverSession::free_region() {
  delivery_.reset();
  lender_ = nullptr;
  sink_.reset();
  proto_.reset();
  to_sender_.reset();
  own_worker_.reset();
}

// Tell the sender to stop (or resume) filling this one device; the others keep flowing.
void ReceiverSession::on_pause(uint16_t device, bool paused) {
  (void)control_->send(wire::MsgType::kPause, wire::encode(wire::Pause{device, paused}));
  if (!paused) return;
  ++report_.stalls;
  // A slow worker pauses its device again and again: say so at most every kBusyLogInterval
  // per device (the metrics count every pause).
  if (auto& next = next_pause_log_[device]; Clock::now() >= next) {
    next = Clock::now() + kBusyLogInterval;
    rx_.event("sender " + report_.sender.name + ": device " + std::to_string(device) +
              " paused while its worker catches up (the other devices keep flowing)");
  }
}

void ReceiverSession::hold_all(bool held) {
  // Without per-block holds the records simply stay unreleased while the sink refuses them.
  if (desc_->holds) {
    for (uint32_t i = 0; i < geometry_.blocks; ++i) {
      if (!hold_active_[i]) proto_->set_hold(i, held);
    }
  }
  held_all_ = held;
}

void ReceiverSession::fill_report(Clock::time_point start) {
  const auto& c = delivery_->counters();
  report_.messages = c.messages;
  report_.bytes = c.bytes;
  report_.gaps = c.gaps;
  report_.duplicates = c.duplicates;
  report_.unknown_device = c.unknown_device;
  report_.out_of_window = c.out_of_window;
  report_.bad_headers = c.bad_headers;
  if (c.buffer_observed_ns > 0) {
    report_.buffer_held_avg = c.buffer_held_byte_ns / c.buffer_observed_ns;
    report_.buffer_useful_avg = c.buffer_useful_byte_ns / c.buffer_observed_ns;
  }
  report_.partial_discarded = c.partial_discarded + c.broken_messages;
  report_.already_stored = 0;
  for (uint16_t d : report_.sender.devices) {
    if (auto n = sink_->numbering(d)) report_.already_stored += n->already_stored;
  }
  report_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report_.held_blocks =
      held_all_ ? geometry_.blocks : uint64_t(std::count(hold_active_.begin(), hold_active_.end(), true));
  report_.per_device = delivery_->per_device();
  if (lender_) {
    report_.views_lent = lender_->lent();
    report_.views_held_blocks = lender_->lending()->held();
  }
  report_.protocol_counters = proto_->stats().counters;
  report_.store_latency = c.store_latency;
}

void ReceiverSession::publish(Clock::time_point start) {
  auto fingerprint = report_fingerprint();
  if (fingerprint == loop_.published) return;
  loop_.published = std::move(fingerprint);
  fill_report(start);
  rx_.publish(this, group_, report_);
}

std::vector<uint64_t> ReceiverSession::report_fingerprint() const {
  const auto& c = delivery_->counters();
  return {c.messages,
          c.bytes,
          c.gaps,
          c.duplicates,
          c.unknown_device,
          c.out_of_window,
          c.bad_headers,
          c.broken_messages,
          c.partial_discarded,
          report_.stalls,
          uint64_t(held_all_),
          uint64_t(std::count(hold_active_.begin(), hold_active_.end(), true)),
          uint64_t(delivery_->any_paused())};
}

void ReceiverSession::apply_holds(Clock::time_point start) {
  const auto ms = start == Clock::time_point{} ? 0 : std::chrono::duration_cast<Millis>(Clock::now() - start).count();
  for (const HoldSpec& h : rx_options_.holds) {
    if (h.index >= geometry_.blocks) continue;
    bool want = ms >= h.from_ms && ms < h.to_ms;
    if (want != hold_active_[h.index]) {
      hold_active_[h.index] = want;
      // A protocol without per-block status (sliding window) cannot mark the block
      // unavailable; the closest the receiver can do is keep it unprocessed for that time.
      if (desc_->holds) {
        proto_->set_hold(h.index, want);
      } else {
        delivery_->set_blocked(h.index, want);
      }
    }
  }
}

void ReceiverSession::begin_consume() {
  loop_ = Loop{};
  loop_.start = loop_.last_work = loop_.next_busy_log = loop_.next_publish = loop_.next_check = Clock::now();
  hold_active_.assign(geometry_.blocks, false);
}

// Thread per sender: passes until the session ends, idle in between (paper §3.2.5: "sleeps for a
// fixed time before querying again"). While data flows the receiver keeps polling (a sleeping
// receiver stalls a sender whose blocks are all full); once idle for kSpinIdle it sleeps, longer
// the longer it has been idle (idle_nap) — so an idle receiver costs ~no CPU and a burst is picked
// up within ~1 ms (20 ms after a long pause).
//
// Where the transport needs the receiver's progress for the sender's puts (tcp: the fabric carries
// them), the consumer progresses the shared worker itself while it polls, and the transport's
// progress thread stands down meanwhile (ProgressThread::Driver): else that thread is woken from
// the kernel for every block, a third thread on the receiving path. A progress call that did
// something counts as work: a block still arriving (1 MiB is many reads of its socket) keeps the
// consumer polling until it is in place. The consumer lets go before it sleeps.
void ReceiverSession::consume(const std::function<bool()>& park) {
  begin_consume();
  fabric::ProgressThread::Driver drive(fabric_->progress.get());
  while (step()) {
    if (rx_options_.busy_poll) {
      drive.poll();
      continue;
    }
    const auto now = loop_.now;
    if (can_park(now)) {
      drive.release();
      if (!park()) return;  // ended while parked
      loop_.last_work = Clock::now();
    } else if (loop_.stalled && now < loop_.retry_at) {
      drive.release();
      std::this_thread::sleep_until(loop_.retry_at);
    } else if (!loop_.worked && lender_ && delivery_->lend_limited()) {
      // The application holds as many blocks as it may: wait for it to release one rather than poll
      // (polling would take half of a core that the application's releasing thread shares).
      drive.release();
      lender_->lending()->wait_release(kLendWait);
    } else if (now - loop_.last_work > kSpinIdle) {
      drive.release();
      proto_->wait(std::chrono::duration_cast<std::chrono::microseconds>(idle_nap(now - loop_.last_work)));
    } else if (drive.poll() != 0) {
      loop_.last_work = Clock::now();  // data is arriving: keep driving until it is here
    } else if (!loop_.worked) {
      std::this_thread::yield();  // let the sender (maybe on this core) fill the next block
    }
  }
}

// Only a plainly idle session parks: one that waits on a timer of its own (a stall's retry, the
// FIN's grace, a lost sender's drain, test holds) keeps its thread.
bool ReceiverSession::can_park(Clock::time_point now) const {
  const Loop& l = loop_;
  return now - l.last_work > kParkAfter && !l.stalled && !l.fin && l.lost.empty() && rx_options_.holds.empty();
}

bool ReceiverSession::step() {
  Loop& l = loop_;
  if (rx_.is_stopping()) {
    delivery_->abort_partials();
    report_.reason = "receiver stopped";
    tell_stopped();
    return false;
  }
  if (!l.lost.empty()) return drain_lost();
  if (!rx_options_.holds.empty()) apply_holds(hold_clock_);

  const bool progressed = proto_->progress();
  const auto now = l.now = Clock::now();
  size_t consumed = 0;
  if (!l.stalled || now >= l.retry_at) consumed = deliver();
  if (hold_clock_ == Clock::time_point{} && delivery_->seen_data()) hold_clock_ = now;
  if (l.fin && fin_complete(consumed)) return false;

  l.worked = consumed > 0 || progressed;
  if (l.worked) l.last_work = now;
  if (now >= l.next_check) {
    // Every ms while data flows; an idle sender's socket (a FIN, or its end) every kIdleCheck: with
    // a thousand idle senders the poll(2) of every socket at every look was a fifth of the cost.
    l.next_check = now + (now - l.last_work > kLongIdle ? kIdleCheck : Millis(1));
    check_control(now);
  }
  return true;
}

// The receiver stops: the sender hears so, and why, before close() frees the memory it writes —
// else it learns only from what fails next (over tcp "the peer refused the read (outside its
// registered memory)"). REFUSE mid-stream ends a sender's connection with its message.
void ReceiverSession::tell_stopped() {
  std::string why = rx_.stop_reason();
  if (why.size() > kMaxStopReason) why = why.substr(0, kMaxStopReason) + "...";
  const std::string text = "the receiver stopped" + (why.empty() ? "" : ": " + why);
  if (!why.empty()) report_.reason = text;
  (void)control_->send(wire::MsgType::kRefuse, wire::encode(wire::Refuse{Code::kPeerGone, text}));
}

// After a sender died, let the progress thread apply what already arrived before the last drain.
void ReceiverSession::lose_sender(const std::string& why) {
  loop_.lost = why;
  loop_.lost_at = Clock::now() + kLostGrace;
}

// The sender is gone: once the grace has passed, one last drain, then the session ends (false).
bool ReceiverSession::drain_lost() {
  if (Clock::now() < loop_.lost_at) return true;
  // The sender is gone. Records already complete hold whole data: keep them (the sink may
  // still fail), then discard what is partial.
  size_t consumed = 1;
  while (consumed > 0) {
    if (!delivery_->pass(&consumed).is_ok()) break;
  }
  delivery_->abort_partials();
  report_.reason = loop_.lost;
  return false;
}

// One delivery pass; returns the records it consumed.
size_t ReceiverSession::deliver() {
  size_t consumed = 0;
  Status st = delivery_->pass(&consumed, loop_.now);
  if (!st.is_ok()) {
    stall(st);
  } else if (loop_.stalled) {
    unstall();
  }
  if (lender_) note_lend_limit();
  return consumed;
}

// Zero-copy: the application holds the most blocks it may. Nothing more is lent (the sender waits
// for free blocks) until it releases a view: say so once per episode — an application that keeps
// every view while it waits for the next message would wait forever.
// A consumer that keeps up touches the limit now and then: logged at most every kBusyLogInterval
// (report_.view_limit_waits counts every time).
void ReceiverSession::note_lend_limit() {
  const bool limited = delivery_->lend_limited();
  if (limited && !loop_.lend_limited) {
    ++report_.view_limit_waits;
    if (loop_.now >= loop_.next_limit_log) {
      loop_.next_limit_log = loop_.now + kBusyLogInterval;
      // The count at the refusal, not held() now: views released since would understate it.
      const auto& lending = *lender_->lending();
      rx_.event("sender " + report_.sender.name + ": the application holds " +
                std::to_string(lending.held_at_refusal()) + " blocks through message views, the most it may " +
                "(max_held_blocks " + std::to_string(lending.max_held()) + "); the sender waits until it releases one");
    }
  }
  loop_.lend_limited = limited;
}

// Stop accepting: the data stays in its block, the empty ones are marked held (paper status 2),
// and the sender waits until the sink works again; retried every kStallRetry. Log each new
// reason once. Worker back-pressure comes and goes with every message a slow worker finishes:
// log it at most every kBusyLogInterval (the metrics count stalls).
void ReceiverSession::stall(const Status& st) {
  Loop& l = loop_;
  const bool busy = st.code() == Code::kBusy;
  const bool news = !l.stalled ? !busy || Clock::now() >= l.next_busy_log : st.message() != l.last_error && !busy;
  if (news) {
    // Worker back-pressure is flow control; a failing sink (a full disk) needs someone to act.
    std::string text = "sender " + report_.sender.name + ": holding blocks until this clears: " + st.to_string();
    busy ? rx_.event(text) : rx_.warning(text);
    if (busy) l.next_busy_log = Clock::now() + kBusyLogInterval;
    l.logged_stall = true;
  }
  if (!l.stalled) {
    hold_all(true);
    ++report_.stalls;
  }
  l.stalled = true;
  l.last_error = st.message();
  l.retry_at = Clock::now() + kStallRetry;
}

void ReceiverSession::unstall() {
  Loop& l = loop_;
  l.stalled = false;
  hold_all(false);
  if (l.logged_stall) rx_.event("sender " + report_.sender.name + ": storing again");
  l.logged_stall = false;
}

// After FIN: answers FIN_ACK (true: the session ends) once every message the FIN counts is
// stored, or once nothing has moved for kFinGrace (the rest is reported missing).
bool ReceiverSession::fin_complete(size_t consumed) {
  Loop& l = loop_;
  // A reference protocol (ucx_raw_put) delivers nothing by design: the flushed FIN is all.
  bool complete = desc_->reference || !delivery_->has_open_message();
  for (auto [d, n] : l.fin->messages) complete = complete && (desc_->reference || delivery_->messages(d) >= n);
  // Messages waiting for the sink, a paused device or the application's views (the lending
  // limit) are not missing: the grace starts again while any of them waits.
  const bool waiting = l.stalled || delivery_->any_paused() || delivery_->lend_limited();
  if (complete || (consumed == 0 && !waiting && Clock::now() > l.fin_deadline)) {
    const uint64_t missing =
        desc_->reference ? 0 : missing_messages(*l.fin, [this](uint16_t d) { return delivery_->messages(d); });
    delivery_->abort_partials();
    wire::FinAck ack;
    ack.ok = missing == 0;
    ack.stored = delivery_->counters().messages;
    ack.message = missing == 0 ? "all stored" : std::to_string(missing) + " messages did not arrive";
    (void)control_->send(wire::MsgType::kFinAck, wire::encode(ack));
    report_.finished = missing == 0;
    if (missing) report_.reason = ack.message;
    return true;
  }
  if (consumed > 0 || waiting) l.fin_deadline = Clock::now() + kFinGrace;
  return false;
}

// STORED, when the sender asked for it and something was stored since the last one.
void ReceiverSession::confirm_stored(Clock::time_point now) {
  if (!confirm_ || now < next_confirm_) return;
  next_confirm_ = now + kConfirmInterval;
  bool moved = false;
  for (auto& [d, c] : confirmed_.devices) {
    const uint64_t stored = delivery_->messages(d) - numbered_at_[d];
    moved = moved || stored != c.stored;
    c.stored = stored;
  }
  if (moved) send_stored();
}

// Several frames when one cannot hold every device (wire::split_stored).
void ReceiverSession::send_stored() {
  for (const auto& body : wire::split_stored(confirmed_)) (void)control_->send(wire::MsgType::kStored, body);
}

// About every ms: the live report (every 100 ms), then the control socket — a closed connection
// means the sender is lost; a frame before FIN must be FIN.
void ReceiverSession::check_control(Clock::time_point now) {
  Loop& l = loop_;
  if (now >= l.next_publish) {
    l.next_publish = now + Millis(100);
    publish(l.start);
  }
  confirm_stored(now);
  // KEEPALIVE (control version 8): the sender hears from this session at least every
  // kKeepaliveInterval, also while its blocks are held (a full disk, a busy worker), so that one
  // that hears nothing for its stall timeout knows this process stopped or hung.
  if (now - control_->last_sent() >= wire::kKeepaliveInterval) (void)control_->send(wire::MsgType::kKeepalive, {});
  Status alive = control_->check_alive();
  if (alive.code() == Code::kPeerGone) {
    lose_sender("connection closed mid-stream");
    return;
  }
  if (alive.code() == Code::kInProgress && !l.fin) {
    wire::Frame frame;
    Status rs = control_->receive(Millis(1000), &frame);
    if (!rs.is_ok()) {
      rx_.event("sender " + report_.sender.name + ": " + rs.message() + "; ending its session");
      lose_sender("bad control message: " + rs.message());
      return;
    }
    control_frame(frame);
  }
}

// A frame while data moves: FIN (the last one), or NUMBER (any number of them).
void ReceiverSession::control_frame(const wire::Frame& frame) {
  Status rs;
  if (frame.type == wire::MsgType::kNumber) {
    wire::Number n;
    rs = wire::decode(frame.body, &n);
    if (rs.is_ok()) rs = control_->send(wire::MsgType::kNumbered, wire::encode(on_number(n)));
  } else if (frame.type == wire::MsgType::kFin) {
    return on_fin(frame);
  } else {
    rs = {Code::kProtocolError,
          "unexpected control message type " + std::to_string(int(frame.type)) + " while data moves"};
  }
  if (!rs.is_ok()) {
    rx_.event("sender " + report_.sender.name + ": " + rs.message() + "; ending its session");
    lose_sender("bad control message: " + rs.message());
  }
}

void ReceiverSession::on_fin(const wire::Frame& frame) {
  fabric::test_stop_point("fin");
  wire::Fin f;
  Status rs = wire::decode(frame.body, &f);
  if (auto why = rs.is_ok() ? check_fin(f, report_.sender.devices) : std::nullopt) rs = {Code::kProtocolError, *why};
  if (!rs.is_ok()) {
    rx_.event("sender " + report_.sender.name + ": " + rs.message() + "; ending its session");
    lose_sender("bad control message: " + rs.message());
    return;
  }
  loop_.fin = std::move(f);
  loop_.fin_deadline = Clock::now() + kFinGrace;
}

// NUMBER: the device's next message is stored as n.number (its sink skips the numbers stored
// elsewhere meanwhile). The sender sent every earlier message of it and saw them stored, and sends
// no more until the answer; a refusal leaves the numbering as it was.
wire::Numbered ReceiverSession::on_number(const wire::Number& n) {
  wire::Numbered a{n.device, n.number, false, ""};
  const auto& declared = report_.sender.devices;
  auto* numbered = dynamic_cast<sink::SkippableSink*>(sink_.get());
  Status st;
  if (std::find(declared.begin(), declared.end(), n.device) == declared.end()) {
    st = {Code::kInvalidArgument, "this connection did not declare the device"};
  } else if (!numbered) {
    st = {Code::kInvalidArgument, "this receiver's sink does not number messages"};
  } else {
    st = numbered->skip_to(n.device, n.number);
  }
  if (!st.is_ok()) {
    a.message = "device " + std::to_string(n.device) + " cannot continue at message " + std::to_string(n.number) +
                ": " + st.message();
    rx_.event("sender " + report_.sender.name + ": " + a.message);
    return a;
  }
  numbered_at_[n.device] = delivery_->messages(n.device);
  if (confirm_) confirmed_.devices[n.device] = {n.number, 0};
  a.ok = true;
  return a;
}

}  // namespace slotstream::session
