#include "engine/ucx/protocol/posted_receives.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

namespace slotstream::protocol {

// ------------------------------------------------------------------------------ ReceiveQueue

ReceiveQueue::ReceiveQueue(uint32_t buffers)
    : state_(buffers, State::kPosted),
      length_(buffers, 0),
      generation_(buffers, 0) {
  for (uint32_t i = 0; i < buffers; ++i) posted_.push_back(i);
  exposed_.reserve(buffers);
}

void ReceiveQueue::expose(uint32_t i, uint32_t length) {
  state_[i] = State::kExposed;
  length_[i] = length;
  exposed_.push_back({i, generation_[i]});
  unreleased_bytes_ += length;
  ++unreleased_;
  if (unreleased_bytes_ > max_unreleased_bytes_) max_unreleased_bytes_ = unreleased_bytes_;
  if (unreleased_ > max_unreleased_) max_unreleased_ = unreleased_;
}

void ReceiveQueue::exposed(std::vector<Ready>* out) {
  // Drop what was released since the last call (its generation moved on), keep the order.
  size_t keep = 0;
  for (const Entry& e : exposed_) {
    if (state_[e.buffer] != State::kExposed || generation_[e.buffer] != e.generation) continue;
    exposed_[keep++] = e;
    out->push_back({e.buffer, length_[e.buffer]});
  }
  exposed_.resize(keep);
}

std::optional<uint32_t> ReceiveQueue::release(uint32_t i) {
  if (i >= state_.size() || state_[i] != State::kExposed) return std::nullopt;
  state_[i] = State::kPosted;
  ++generation_[i];
  unreleased_bytes_ -= length_[i];
  --unreleased_;
  posted_.push_back(i);
  return length_[i];
}

// ---------------------------------------------------------------------------- PostedReceives

uint64_t next_receive_tag() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Status PostedReceives::create(ReceiverFabric& fabric, uint64_t tag, std::unique_ptr<PostedReceives>* out) {
  const Geometry& g = fabric.geometry;
  std::unique_ptr<fabric::MemoryRegion> region;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate(fabric.context, g.bytes(), &region));
  std::unique_ptr<PostedReceives> p(new PostedReceives(fabric, tag, std::move(region)));
  // SDP §2.1: every receive is posted before the sender learns where we are, so its first N
  // messages (its initial credits) always find one.
  for (uint32_t i = 0; i < g.blocks; ++i) SLOTSTREAM_RETURN_IF_ERROR(p->post(i));
  *out = std::move(p);
  return Status::ok();
}

PostedReceives::PostedReceives(ReceiverFabric& fabric, uint64_t tag, std::unique_ptr<fabric::MemoryRegion> region)
    : context_(fabric.context),
      worker_(fabric.worker),
      geometry_(fabric.geometry),
      tag_(tag),
      region_(std::move(region)),
      receives_(fabric.geometry.blocks),
      queue_(fabric.geometry.blocks) {}

PostedReceives::~PostedReceives() {
  for (auto& r : receives_) r.cancel();
  // Cancelled receives complete at once; one already matched to a rendezvous message completes
  // when its data is in (or fails when the sender is gone). Wait for those, bounded.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    bool busy = false;
    for (auto& r : receives_) {
      size_t length = 0;
      if (r.pending() && r.check(&length).code() == Code::kInProgress) busy = true;
    }
    if (!busy) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    worker_.progress();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // UCX may still write into these buffers: never unmap them under it.
  spdlog::warn(
      "tagged receives still being filled at teardown: keeping {} bytes of receive buffers mapped "
      "until the transport shuts down",
      region_->size());
  context_.park(std::move(region_));
}

ReceiveQueue::Outcome PostedReceives::check(uint32_t i, uint32_t* length) {
  fabric::TagReceive& r = receives_[i];
  if (!r.pending()) {
    // Not posted at all: re-posting it failed earlier. Try again; until it works the receives
    // posted after it wait, so that their messages cannot overtake the one meant for it.
    if (!post(i).is_ok()) return ReceiveQueue::Outcome::kPending;
  }
  const bool unexpected = r.was_unexpected();
  size_t len = 0;
  Status st = r.check(&len);
  if (st.code() == Code::kInProgress) return ReceiveQueue::Outcome::kPending;
  if (unexpected) ++unexpected_;  // sent before its receive was posted
  if (!st.is_ok()) {
    // Longer than a buffer (only a sender that ignores the geometry) or a transport error: the
    // message is lost (the stream layer sees a gap) and the buffer goes back into service.
    ++failed_;
    spdlog::debug("tagged receive into buffer {} failed: {}", i, st.to_string());
    if (!post(i).is_ok()) ++repost_failures_;
    return ReceiveQueue::Outcome::kFailed;
  }
  *length = static_cast<uint32_t>(len);
  return ReceiveQueue::Outcome::kArrived;
}

Status PostedReceives::post(uint32_t i) {
  return worker_.tag_recv(buffer(i), geometry_.block_size, tag_, &receives_[i]);
}

void PostedReceives::poll(std::vector<Record>* out) {
  queue_.advance([&](uint32_t i, uint32_t* length) { return check(i, length); });
  ready_.clear();
  queue_.exposed(&ready_);
  for (const auto& r : ready_) {
    out->push_back({r.buffer, r.buffer, {buffer(r.buffer), r.length}});
  }
}

std::map<std::string, uint64_t> PostedReceives::counters() const {
  return {{"unexpected_messages", unexpected_},
          {"failed_receives", failed_},
          {"repost_failures", repost_failures_},
          {"max_unreleased_records", queue_.max_unreleased()},
          {"max_unreleased_bytes", queue_.max_unreleased_bytes()}};
}

std::optional<uint32_t> PostedReceives::release(uint64_t id) {
  if (id >= geometry_.blocks) return std::nullopt;
  const auto i = static_cast<uint32_t>(id);
  std::optional<uint32_t> length = queue_.release(i);
  if (!length) return std::nullopt;
  ++released_;
  // SDP §2.1: the buffer is posted again before its credit goes back to the sender.
  if (!post(i).is_ok()) ++repost_failures_;
  return length;
}

}  // namespace slotstream::protocol
