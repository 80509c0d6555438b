#include "engine/ucx/stream/lending.h"

#include <algorithm>

namespace slotstream {

// --------------------------------------------------------------- MessageView (slotstream.h)

MessageView& MessageView::operator=(MessageView&& other) noexcept {
  if (this != &other) {
    lease_ = std::move(other.lease_);
    data_ = other.data_;
    device_ = other.device_;
    packet_ = other.packet_;
    copied_ = other.copied_;
    other.data_ = {};
  }
  return *this;
}

const std::string& MessageView::sender() const {
  static const std::string kNone;
  return lease_ ? lease_->lending->sender() : kNone;
}

void MessageView::release() {
  data_ = {};
  lease_.reset();  // the last view of a block gives it back (BlockLease::~BlockLease)
}

MessageView MessageView::Lease::make_view(std::shared_ptr<Lease> lease, std::span<const std::byte> data,
                                          uint16_t device, uint32_t packet, bool copied) {
  MessageView v;
  v.lease_ = std::move(lease);
  v.data_ = data;
  v.device_ = device;
  v.packet_ = packet;
  v.copied_ = copied;
  return v;
}

namespace stream {

// ------------------------------------------------------------------------------- leases

BlockLease::BlockLease(std::shared_ptr<Lending> lending, uint64_t id) : Lease(std::move(lending)), id(id) {}

BlockLease::~BlockLease() {
  // paper §3.3: the retained block becomes free again; the sender may write it.
  if (retained) lending->protocol().release_retained(id);
  lending->held_.fetch_sub(1, std::memory_order_relaxed);
  lending->released();
}

Lending::Lending(std::string sender, std::shared_ptr<fabric::Context> context,
                 std::shared_ptr<protocol::ReceiverProtocol> proto, uint32_t blocks, uint32_t max_held)
    : sender_(std::move(sender)),
      context_(std::move(context)),
      proto_(std::move(proto)),
      max_held_(held_limit(blocks, max_held)) {}

uint32_t Lending::held_limit(uint32_t blocks, uint32_t max_held) {
  if (max_held == 0) max_held = blocks / 2;
  return std::clamp<uint32_t>(max_held, 1, std::max<uint32_t>(blocks, 1));
}

std::shared_ptr<BlockLease> Lending::lease(uint64_t id) {
  // Only the consumer leases, so nothing can raise held_ between this load and the add.
  if (const uint32_t held = held_.load(std::memory_order_relaxed); held >= max_held_) {
    held_at_refusal_ = held;
    return nullptr;
  }
  held_.fetch_add(1, std::memory_order_relaxed);
  return std::make_shared<BlockLease>(shared_from_this(), id);
}

void Lending::released() {
  {
    std::lock_guard lock(release_mu_);
    ++releases_;
  }
  release_cv_.notify_all();
}

void Lending::wait_release(std::chrono::microseconds timeout) {
  std::unique_lock lock(release_mu_);
  const uint64_t seen = releases_;
  release_cv_.wait_for(lock, timeout,
                       [&] { return releases_ != seen || held_.load(std::memory_order_relaxed) < max_held_; });
}

std::shared_ptr<CopyLease> Lending::copy() { return std::make_shared<CopyLease>(shared_from_this()); }

// ------------------------------------------------------------------------------ the sink

LendingSink::LendingSink(std::shared_ptr<Lending> lending, std::unique_ptr<ViewSink> views)
    : lending_(std::move(lending)),
      views_(std::move(views)) {}

Status LendingSink::hand(MessageView& view) { return views_->take(view); }

Status LendingSink::lend(std::span<const Message> batch, std::span<const std::shared_ptr<BlockLease>> leases,
                         size_t* stored) {
  for (*stored = 0; *stored < batch.size(); ++*stored) {
    const Message& m = batch[*stored];
    MessageView view;
    if (leases[*stored]) {
      view = MessageView::Lease::make_view(leases[*stored], m.data, m.device, m.packet, false);
    } else {
      auto copy = lending_->copy();
      copy->bytes.assign(m.data.begin(), m.data.end());
      view = MessageView::Lease::make_view(copy, copy->bytes, m.device, m.packet, true);
    }
    SLOTSTREAM_RETURN_IF_ERROR(hand(view));
    if (leases[*stored]) ++lent_;
  }
  return Status::ok();
}

Status LendingSink::deliver(std::span<const Message> batch, size_t* stored) {
  static const std::vector<std::shared_ptr<BlockLease>> kNone(1);
  for (*stored = 0; *stored < batch.size(); ++*stored) {
    size_t one = 0;
    SLOTSTREAM_RETURN_IF_ERROR(lend(batch.subspan(*stored, 1), kNone, &one));
  }
  return Status::ok();
}

LendingSink::Open* LendingSink::find(uint16_t device) {
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Open& o) { return o.device == device; });
  return it == open_.end() ? nullptr : &*it;
}

Status LendingSink::begin(uint16_t device) {
  Open* o = find(device);
  if (!o) o = &open_.emplace_back(Open{device});
  o->packet = first_packet_;
  o->copy = lending_->copy();
  return Status::ok();
}

Status LendingSink::append(uint16_t device, std::span<const std::byte> data) {
  Open* o = find(device);
  if (!o || !o->copy) return {Code::kInvalidArgument, "append without begin"};
  o->copy->bytes.insert(o->copy->bytes.end(), data.begin(), data.end());
  return Status::ok();
}

// A message that spanned blocks: copied once (its blocks are released as they are consumed).
Status LendingSink::commit(uint16_t device) {
  Open* o = find(device);
  if (!o || !o->copy) return {Code::kInvalidArgument, "commit without begin"};
  const auto& bytes = o->copy->bytes;
  MessageView view = MessageView::Lease::make_view(o->copy, bytes, device, o->packet, true);
  SLOTSTREAM_RETURN_IF_ERROR(hand(view));
  o->copy.reset();
  return Status::ok();
}

void LendingSink::abort(uint16_t device) {
  if (Open* o = find(device)) o->copy.reset();
}

}  // namespace stream
}  // namespace slotstream
