// SenderLane's data path (sender_lane.h): liveness and the receiver's control frames, draining the send ring
// (by a filler holding the token or by the sending thread), the sending thread's loop, NUMBER and FIN.
#include <algorithm>
#include <cstdio>

#include "common.h"
#include "engine/ucx/session/sender_lane.h"
#include "engine/ucx/session/sender_lane_timing.h"
#include "engine/ucx/stream/trace.h"
#include "wire/block_header.h"

namespace slotstream::session {

// Rate-limited: one poll() of the control socket per millisecond at most.
Status SenderLane::alive_st() {
  // A sender failed or cancelled (Sender::abort) elsewhere: waits inside the protocol end here.
  if (owner_.failed()) return owner_.first_error();
  auto now = Clock::now();
  if (now < next_liveness_) return Status::ok();
  next_liveness_ = now + kLivenessInterval;
  // The sender failed elsewhere (another lane, Sender::abort): a wait for receiver space ends here too.
  if (owner_.failed()) return owner_.first_error();
  if (endpoint_->failed()) return receiver_lost("transport error: " + endpoint_->failure().message());
  Status st = control_->check_alive();
  if (st.code() == Code::kPeerGone) return receiver_lost("it closed the connection");
  if (st.code() == Code::kInProgress) {  // a frame is waiting
    wire::Frame frame;
    SLOTSTREAM_RETURN_IF_ERROR(control_->receive(Millis(1000), &frame));
    return control_frame(frame);
  }
  return check_silence(now);
}

// A receiver process that is stopped (SIGSTOP), hung or cut off keeps its connection open and its
// blocks full: only its silence shows it (control version 8: a live one sends KEEPALIVE every
// second, whatever else it does). Checked only when no frame waits to be read.
Status SenderLane::check_silence(Clock::time_point now) const {
  const auto limit = owner_.sender_options().stall_timeout;
  if (limit.count() == 0 || now - control_->last_received() <= limit) return Status::ok();
  const auto silent = std::chrono::duration_cast<Millis>(now - control_->last_received());
  char what[200];
  std::snprintf(what, sizeof what,
                "it has said nothing for %.1f s, not even the keepalive a live receiver sends every second: it is "
                "stopped, hung or cut off (stall timeout %.1f s)",
                silent.count() / 1000.0, limit.count() / 1000.0);
  return receiver_lost(what);
}

Status SenderLane::control_frame(const wire::Frame& frame) {
  if (frame.type == wire::MsgType::kPause) {
    wire::Pause pause;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &pause));
    owner_.set_paused(pause.device, pause.paused);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kStored) {
    wire::Stored stored;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &stored));
    owner_.on_stored(stored);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kKeepalive) return wire::decode_keepalive(frame.body);
  if (frame.type == wire::MsgType::kNumbered) {
    wire::Numbered answer;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &answer));
    owner_.on_numbered(answer);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    // A stopping receiver says "the receiver stopped[: why]" (ReceiverSession::tell_stopped).
    if (refuse.code == Code::kPeerGone) return receiver_lost(refuse.message);
    return {refuse.code, "receiver ended the connection: " + refuse.message};
  }
  return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type)) + " while sending"};
}

// A receiver that stops says so (REFUSE) before it frees the memory this lane writes; what fails
// here next (over tcp: "the peer refused the read (outside its registered memory)", a status read
// into memory no longer registered) is only the consequence. Its REFUSE may arrive a little after
// the data path's error (two connections): waited for up to kRefusalWait. A sender cancelled here
// (Sender::abort) has nothing to hear.
Status SenderLane::receiver_said_st(Status st) {
  if (st.is_ok() || st.code() == Code::kCancelled || !control_) return st;
  const auto until = Clock::now() + kRefusalWait;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    wire::Frame frame;
    if (!control_->receive(std::max(left, Millis(1)), &frame).is_ok()) return st;  // nothing said: closed, or quiet
    Status said = control_frame(frame);                                            // PAUSE and STORED apply as ever
    if (frame.type == wire::MsgType::kRefuse) return said;
    if (Clock::now() >= until) return st;
  }
}

// With the token: transmits units from the cursor on, in ticket order (at most a ring's worth, so
// that a filler holding the token goes back to filling), then reaps finished transfers.
Status SenderLane::drain_st(bool filler, bool wait_whole, size_t budget, size_t* sent, bool* handed) {
  *sent = 0;
  *handed = false;
  for (size_t n = 0; ring_->has_work(); ++n) {
    if (n == budget) {
      if (filler) {  // its share done: the sending thread goes on, the filler goes back to filling
        ring_->hand_to_sender();
        *handed = true;
      }
      break;
    }
    // No receiver room: a filler does not wait where records pack (the lane is busy: others'
    // records pack meanwhile); the sending thread waits before it seals the open block, so that
    // they leave with it (a filler waiting itself there made the 256 B rate worse: docs/benchmarks.md,
    // issue 32 item 4). A block claimed whole (a large record, pack=off) has nothing to gain from
    // the hand-off: its filler waits itself, as the paper's sender does. Handing it over would make the
    // sending thread a third busy thread beside the filler and the receiver — on two cores that cost most
    // of the throughput at 64 KiB x 3 blocks (docs/benchmarks.md, "a hand-off per block"). Not a filler
    // with a deadline (`wait_whole` false): the protocol's wait cannot give up in time, so it hands over
    // as before.
    if (filler) {
      bool ready = true;
      SLOTSTREAM_RETURN_IF_ERROR(proto_->space_st(&ready));
      if (!ready && !(wait_whole && ring_->whole_at_cursor())) {
        ring_->hand_to_sender();
        *handed = true;
        break;
      }
      if (!ready) SLOTSTREAM_RETURN_IF_ERROR(proto_->wait_space_st());
    } else {
      SLOTSTREAM_RETURN_IF_ERROR(proto_->wait_space_st());
    }
    stream::SendRing::Unit unit;
    if (!ring_->next_unit(&unit, /*seal_open=*/true)) break;
    SLOTSTREAM_RETURN_IF_ERROR(send_unit_st(unit));
    ++*sent;
  }
  // A filler that handed the lane to the sending thread holds nothing any more: from the hand-off on
  // the worker and the transfers in flight are that thread's (two threads in ucp_worker_progress
  // abort UCX: "Assertion `worker->inprogress++ == 0' failed", seen over tcp with 12 cameras).
  if (*handed) return Status::ok();
  // Transfers that complete only through this worker's progress (a rendezvous tagged send, a tcp
  // put) advance now, by whoever transmitted them: a filler holding the token would otherwise
  // leave them to the sending thread's next turn.
  if (!inflight_.empty()) worker_->progress();
  return reap_st();
}

Status SenderLane::send_unit_st(const stream::SendRing::Unit& unit) {
  ring_->advance();
  if (unit.length == 0) {  // nothing in it (a fill gave up): free the block unsent
    ring_->release(unit.ticket);
    return Status::ok();
  }
  fabric::Request req;
  SLOTSTREAM_RETURN_IF_ERROR(proto_->transmit_st(unit.data, unit.length, &req));
  records_ += unit.records;
  ++units_;
  packed_ |= unit.packed;
  if (stream::tracing()) {
    wire::UnitReader reader({unit.data, unit.length});
    for (wire::UnitReader::Item item; reader.next(&item);) {
      if (!item.header.is_void()) stream::trace(stream::TraceStage::kPosted, item.header.device, item.header.packet);
    }
  }
  if (req.pending()) {
    inflight_.emplace_back(unit.ticket, std::move(req));
  } else {
    ring_->release(unit.ticket);
  }
  if ((++transmitted_ & 63) == 0) {
    SLOTSTREAM_RETURN_IF_ERROR(alive_st());
    held_skips_live_.store(proto_->held_skips_st(), std::memory_order_relaxed);
  }
  return Status::ok();
}

// Frees the blocks of finished transfers, oldest first (their completions come in order).
Status SenderLane::reap_st() {
  while (!inflight_.empty()) {
    Status st = inflight_.front().second.check();
    if (st.code() == Code::kInProgress) break;
    SLOTSTREAM_RETURN_IF_ERROR(st);
    ring_->release(inflight_.front().first);
    inflight_.pop_front();
  }
  in_flight_.store(!inflight_.empty(), std::memory_order_relaxed);
  return Status::ok();
}

// A filler may have to transmit. If no one holds the token, transmit from this thread: a lone
// message leaves without waking the sending thread (the latency path, engine/ucx/stream/send_ring.h).
// Otherwise the holder sees the work before it can give the token back.
Status SenderLane::help(bool wait_whole) {
  // A filler transmits at most a ring's worth of units in one call, then goes back to filling.
  size_t budget = ring_->blocks();
  for (;;) {
    bool holder_sleeps = false;
    if (!ring_->try_take_token(&holder_sleeps)) {
      if (holder_sleeps) ring_->wake_sender();  // the sending thread waits in its worker with it
      return Status::ok();
    }
    size_t sent = 0;
    bool handed = false;
    Status st = drain_st(/*filler=*/true, wait_whole, budget, &sent, &handed);
    if (handed && st.is_ok()) return st;  // the token went to the sending thread
    if (!st.is_ok() || !ring_->give_token()) return leave_token(st);
    // Work arrived that relied on us while we held the token: take it again (the sending thread
    // gets it once our share is done: drain_st hands it over on an empty budget).
    budget -= std::min(budget, sent);
  }
}

// A filler's turn with the token ended (given back): transfers that need the worker progressed to
// complete (tcp, rendezvous) are the sending thread's; an error of the turn fails the sender, and
// every filler returns it.
Status SenderLane::leave_token(Status st) {
  if (needs_watcher()) ring_->wake_sender();
  if (st.is_ok()) return st;
  owner_.fail(explain_transmit_error(receiver_said_st(st)));
  return owner_.first_error();
}

bool SenderLane::linger_st() {
  const auto until = Clock::now() + kBusySpin;
  for (int i = 0;; ++i) {
    if (ring_->has_work()) return true;
    if ((i & 15) == 15 && Clock::now() >= until) return false;
    if (i >= 16) std::this_thread::yield();
  }
}

// The sending thread: transmits what fillers hand to it (the receiver had no room, or a filler
// sent a ring's worth), keeps the token for a moment after it moved data (fillers pack meanwhile),
// and otherwise does the lane's idle work with the token (progresses the worker, the protocol's
// timers, completions, the receiver's liveness), about every millisecond, until finish().
Status SenderLane::sending_thread_st() {
  bool moved = false;  // the last turn transmitted: spin for the next unit rather than sleep
  bool holding = false;
  std::chrono::microseconds period = kIdlePeriod;
  uint64_t last_cursor = 0;
  Clock::time_point last_activity = Clock::now();
  std::chrono::microseconds token_nap = kTokenTakenNap;
  for (;;) {
    if (!holding) {
      (void)ring_->wait_work(moved ? kBusySpin : kIdleSpin, period);
      if (owner_.failed()) return Status::ok();  // reported by its thread
      holding = ring_->take_handoff() || ring_->try_take_token();
      if (!holding) {  // a filler is transmitting
        ring_->nap(token_nap);
        token_nap = std::min(2 * token_nap, kMaxTokenTakenNap);
        moved = false;
        continue;
      }
    }
    token_nap = kTokenTakenNap;
    size_t sent = 0;
    bool handed = false;
    packed_ = false;
    Status st = drain_st(/*filler=*/false, /*wait_whole=*/false, ring_->blocks(), &sent, &handed);
    if (st.is_ok() && sent == 0) {  // idle
      worker_->progress();
      st = proto_->idle_st();
      if (st.is_ok()) st = reap_st();
      if (st.is_ok()) st = alive_st();
    }
    SLOTSTREAM_RETURN_IF_ERROR(st);  // keeps the token: the lane is done
    if (owner_.failed()) return Status::ok();
    if (finishing_.load(std::memory_order_acquire) && ring_->drained()) break;
    const auto now = Clock::now();
    if (ring_->cursor() != last_cursor) {  // someone transmitted since the last turn
      last_cursor = ring_->cursor();
      last_activity = now;
    }
    watching_inflight_.store(!inflight_.empty(), std::memory_order_relaxed);
    period = sending_idle_period(!inflight_.empty(), proto_->holding_st(), now - last_activity);
    moved = sent > 0;
    // After small messages it keeps the token a moment, so that the next ones pack; whole blocks
    // (large messages) gain nothing from that: their fillers transmit themselves again.
    if (moved && packed_ && linger_st()) continue;  // still holding: the next unit is already there
    holding = ring_->give_token();                  // work that relied on us: keep going (we retake it below)
    if (holding) holding = ring_->try_take_token();
  }
  for (auto& [t, req] : inflight_) SLOTSTREAM_RETURN_IF_ERROR(req.wait(*worker_, [this] { return alive_st(); }));
  inflight_.clear();
  return proto_->finish_st();
}

void SenderLane::sending_loop_st() {
  if (Status st = explain_transmit_error(receiver_said_st(sending_thread_st())); !st.is_ok()) owner_.fail(st);
}

// The socket's frames are sent by one thread at a time: this one's, while the sending thread only
// receives (fin() comes after the sending thread ended).
Status SenderLane::number(const wire::Number& number) {
  return control_->send(wire::MsgType::kNumber, wire::encode(number));
}

// Tells the receiver how many messages of each device it must have, and waits until it has
// stored them all (a full disk may make that take a while).
Status SenderLane::fin() {
  wire::Fin fin;
  for (uint16_t d : devices_) fin.messages[d] = owner_.messages_sent(d);
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kFin, wire::encode(fin)));
  fabric::test_stop_point("fin");
  // A receiver that reaches into this sender (Descriptor::receiver_endpoint) reads from us until
  // it has let go of our memory: where UCX emulates its reads (tcp) our worker must answer them,
  // so it is progressed here (the sending thread has ended) until the receiver closes the
  // connection — which it does after it freed its half of the protocol.
  const bool answer = owner_.descriptor().receiver_endpoint;
  wire::Frame frame;
  for (;;) {
    // Short waits: a sender cancelled meanwhile (Sender::abort) stops waiting within 100 ms.
    Status st = control_->receive(answer ? Millis(1) : Millis(100), &frame);
    if (st.code() == Code::kTimeout) {
      if (answer) worker_->progress();
      SLOTSTREAM_RETURN_IF_ERROR(owner_.first_error());
      SLOTSTREAM_RETURN_IF_ERROR(check_silence(Clock::now()));  // a receiver stopped before FIN_ACK
      continue;
    }
    if (st.code() == Code::kPeerGone) return {Code::kPeerGone, "receiver closed the connection before confirming"};
    SLOTSTREAM_RETURN_IF_ERROR(st);
    if (frame.type == wire::MsgType::kFinAck) break;
    SLOTSTREAM_RETURN_IF_ERROR(control_frame(frame));  // a device paused while the last messages are stored
  }
  wire::FinAck ack;
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &ack));
  if (answer) {
    for (const auto until = Clock::now() + kLetGoTimeout; Clock::now() < until;) {
      if (control_->receive(Millis(1), &frame).code() == Code::kPeerGone) break;
      worker_->progress();
    }
  }
  if (!ack.ok) return {Code::kIoError, "receiver reported: " + ack.message};
  return Status::ok();
}

}  // namespace slotstream::session
