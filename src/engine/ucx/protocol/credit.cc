#include "engine/ucx/protocol/credit.h"

#include <algorithm>

#include <bit>
#include <chrono>
#include <cstring>

#include "clock.h"
#include "engine/ucx/protocol/posted_receives.h"
#include "engine/ucx/protocol/reply_queue.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

// Active-message id of the credit update (receiver -> sender), on the sender's own worker.
constexpr unsigned kCreditAm = 21;

static_assert(std::endian::native == std::endian::little, "AM headers are copied as little-endian structs");

// Set-up bytes from the receiver (ACCEPT): u64 tag of this session's messages.

class CreditSender final : public SenderProtocol {
 public:
  CreditSender(SenderFabric& fabric, uint64_t tag) : fabric_(fabric), tag_(tag), account_(fabric.geometry.blocks) {}

  Status init() {
    // Credit updates are handled inside the progress of this sending thread's worker: while the
    // sender has credits it never waits for one, it picks them up whenever it progresses.
    return fabric_.worker.set_am_handler(
        kCreditAm,
        [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp) { on_update(header); },
        &update_handler_);
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    if (!account_.can_send()) {
      // SDP §2.1: "waits until it has enough credits".
      WaitTimer wait(stats_);
      for (PollBackoff backoff; !account_.can_send(); backoff.pause()) {
        if (fabric_.worker.progress() != 0) backoff.reset();
        SLOTSTREAM_RETURN_IF_ERROR(fabric_.alive());
        if (fabric_.endpoint.failed()) return {Code::kPeerGone, "receiver unreachable"};
      }
    }
    // One credit per message, whatever its size (§2.2).
    account_.spend();
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.tag_send(src, length, tag_, data_req));
    ++stats_.records;
    auto& most = stats_.counters["max_messages_in_flight"];  // sent, not yet credited back
    most = std::max<uint64_t>(most, account_.sent() - account_.released());
    return Status::ok();
  }

  // Credits need not come back: the receiver confirms storage on the control connection (FIN).
  Status finish_st() override { return fabric_.endpoint.flush(fabric_.alive); }

  // sync_ops: credit updates handled. sync_op_samples_ns: one per update, from the receiver
  // sending it until this sender handled it (which it does whenever it progresses its worker).
  // counters: credit_updates (= sync_ops), credits_returned, updates_ignored (stale, duplicate
  // or impossible), max_credits_per_update, credits (N), max_messages_in_flight (sent and not yet
  // credited back).
  ProtocolStats stats() const override {
    ProtocolStats s = stats_;
    s.counters["credits"] = account_.credits();
    return s;
  }

 private:
  // Runs inside worker progress, i.e. on the sending thread.
  void on_update(std::span<const std::byte> header) {
    const uint64_t now = now_ns();
    CreditUpdate u;
    if (header.size() != sizeof u) {
      ++stats_.counters["updates_ignored"];
      return;
    }
    std::memcpy(&u, header.data(), sizeof u);
    const uint32_t gained = account_.on_ack(u.released);
    if (gained == 0) {
      ++stats_.counters["updates_ignored"];
      return;
    }
    ++stats_.sync_ops;
    ++stats_.counters["credit_updates"];
    stats_.counters["credits_returned"] += gained;
    auto& most = stats_.counters["max_credits_per_update"];
    if (gained > most) most = gained;
    if (now > u.generated_ns) add_sample(stats_.sync_op_samples_ns, now - u.generated_ns);
  }

  SenderFabric& fabric_;
  uint64_t tag_;
  CreditAccount account_;
  ProtocolStats stats_;
  // The Sender destroys its protocol before its endpoint, whose close still progresses the
  // worker: last, so the handler (it points at this object) is unhooked first.
  fabric::AmRegistration update_handler_;
};

class CreditReceiver final : public ReceiverProtocol {
 public:
  CreditReceiver(ReceiverFabric& fabric, std::unique_ptr<PostedReceives> receives)
      : worker_(fabric.worker),
        geometry_(fabric.geometry),
        receives_(std::move(receives)),
        batcher_(fabric.geometry.blocks),
        updates_(fabric.worker) {}

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(receives_->tag());
    return std::move(w.buffer());
  }

  Status connect(const PeerSetup& peer) override {
    if (!peer.setup.empty()) return {Code::kProtocolError, "unexpected credit set-up bytes from the sender"};
    if (peer.endpoint == nullptr) return {Code::kProtocolError, "credit needs an endpoint to the sender"};
    to_sender_ = peer.endpoint;
    return Status::ok();
  }

  // The receiver polls its own completion queue: tagged receives complete inside progress.
  bool progress() override {
    const bool any = worker_.progress() != 0;
    updates_.reap();
    return any;
  }

  void poll(std::vector<Record>* out) override { receives_->poll(out); }

  void release(uint64_t id) override {
    if (!receives_->release(id)) return;  // not a buffer we handed out: must not return a credit
    if (!batcher_.on_release()) return;
    // SDP §2.1: the credits go back in one update once half of them were used.
    bool queued = false;
    if (to_sender_ == nullptr ||
        !updates_.send(*to_sender_, kCreditAm, CreditUpdate{batcher_.released(), uint64_t(now_ns())}, &queued)
             .is_ok()) {
      ++update_failures_;  // retried with the next batch: the updates are cumulative
      return;
    }
    batcher_.acked();
    ++updates_sent_;
    if (queued) worker_.signal();  // the progress thread may be asleep in the kernel: let it push this out
  }

  uint64_t max_records() const override { return geometry_.blocks; }

  // counters: credit_updates_sent (= sync_ops), update_send_failures, ack_batch (credits per
  // update), and the receive side's (PostedReceives::counters).
  ProtocolStats stats() const override {
    ProtocolStats s;
    s.sync_ops = updates_sent_;
    s.counters = receives_->counters();
    s.counters["credit_updates_sent"] = updates_sent_;
    s.counters["update_send_failures"] = update_failures_;
    s.counters["ack_batch"] = batcher_.batch();
    return s;
  }

 private:
  fabric::Worker& worker_;
  Geometry geometry_;
  std::unique_ptr<PostedReceives> receives_;
  AckBatcher batcher_;
  fabric::Endpoint* to_sender_ = nullptr;
  uint64_t updates_sent_ = 0;
  uint64_t update_failures_ = 0;
  ReplyQueue<CreditUpdate> updates_;  // an update's header outlives its request
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options&,
                   std::unique_ptr<SenderProtocol>* out) {
  wire::Reader r(setup);
  const uint64_t tag = r.u64();
  if (!r.ok() || !r.at_end()) return {Code::kProtocolError, "malformed credit set-up from receiver"};
  auto sender = std::make_unique<CreditSender>(fabric, tag);
  SLOTSTREAM_RETURN_IF_ERROR(sender->init());
  *out = std::move(sender);
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options&, std::unique_ptr<ReceiverProtocol>* out) {
  std::unique_ptr<PostedReceives> receives;
  SLOTSTREAM_RETURN_IF_ERROR(PostedReceives::create(fabric, next_receive_tag(), &receives));
  out->reset(new CreditReceiver(fabric, std::move(receives)));
  return Status::ok();
}

}  // namespace

uint32_t CreditAccount::on_ack(uint64_t released) {
  // Modular: an update older than the last one is "ahead" by almost 2^64 and fails this test
  // like one claiming more than was ever sent.
  const uint64_t gained = released - released_;
  if (gained == 0 || gained > sent_ - released_) return 0;
  released_ = released;
  return static_cast<uint32_t>(gained);
}

const Descriptor kCredit = {
    .name = "credit",
    .summary =
        "SDP §2 credit-based flow control: N pre-posted tagged receives of one block each, one credit "
        "per message whatever its size, credits returned in one two-sided update after half are used",
    .receiver_progress = true,
    .receiver_endpoint = true,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
