// Zero-copy receive's bookkeeping (the public contract is MessageView in slotstream.h).
//
// The paper's status 2 (§3.3): "the receiver might need to retain data within a memory block" — it
// marks the block 2 and the sender skips it (§4.2.7). Here the application retains it: a unit
// (block) with messages lent in place gets a lease; every view of it shares the lease. Once the
// delivery has consumed every record of the unit, it retains the unit (status 2) instead of
// releasing it, and hands the lease over to the views; the last view released (any thread) gives
// the unit back to the protocol (release_retained: status 0).
//
// Only views hold a lease: between passes the delivery keeps a weak reference to the lease of a
// unit some of whose records still wait (a packed unit shared by several devices, a record ahead
// of its predecessor, the limit reached half-way). Views of it all released before its last
// record is consumed end the lease (the unit is then released as any other); its later records
// get a new one. So held() is exactly the units the application's views keep — never units the
// delivery itself waits on, which could fill the limit with blocks no view holds while the
// records they wait for lie in blocks that can no longer be lent.
//
//   Lending     one session's: the protocol (kept alive, with the UCX context, while views live),
//               the sender's name, the count of leased units and its limit.
//   BlockLease  one unit lent in place (counted against the limit).
//   CopyLease   a message copied once (it spanned blocks, or was parked): owns its bytes.
//   LendingSink the MessageSink the delivery drives in this mode: lends batches in place, copies
//               pieces of messages that span blocks, hands each view to the application's ViewSink.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/protocol.h"
#include "slotstream/slotstream.h"

namespace slotstream::stream {
class Lending;
}

namespace slotstream {

// What keeps a MessageView's bytes valid. Any thread may drop the last reference.
struct MessageView::Lease {
  explicit Lease(std::shared_ptr<stream::Lending> lending) : lending(std::move(lending)) {}
  virtual ~Lease() = default;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  static MessageView make_view(std::shared_ptr<Lease> lease, std::span<const std::byte> data, uint16_t device,
                               uint32_t packet, bool copied);
  std::shared_ptr<stream::Lending> lending;
};

}  // namespace slotstream

namespace slotstream::stream {

// One receive unit lent in place, alive while a view of it (or the pass lending it) lives.
// `retained` is set by the consumer (before it lets go of its own reference) once the unit's every
// record is consumed; then the last reference gives it back.
struct BlockLease final : MessageView::Lease {
  BlockLease(std::shared_ptr<Lending> lending, uint64_t id);
  ~BlockLease() override;
  const uint64_t id;
  bool retained = false;  // written before the consumer's reference is dropped (ordered by it)
};

// A message copied once: the view owns its bytes.
struct CopyLease final : MessageView::Lease {
  using Lease::Lease;
  std::vector<std::byte> bytes;
};

class Lending : public std::enable_shared_from_this<Lending> {
 public:
  // `max_held` as ReceiverOptions::max_held_blocks (0: half the blocks); clamped to [1, blocks].
  Lending(std::string sender, std::shared_ptr<fabric::Context> context,
          std::shared_ptr<protocol::ReceiverProtocol> proto, uint32_t blocks, uint32_t max_held);
  static uint32_t held_limit(uint32_t blocks, uint32_t max_held);

  // A lease for unit `id`, or nullptr when max_held() units are leased already (the caller waits).
  // Consumer thread.
  std::shared_ptr<BlockLease> lease(uint64_t id);
  std::shared_ptr<CopyLease> copy();
  uint32_t held() const { return held_.load(std::memory_order_relaxed); }
  // How many units were held when lease() last refused one: what the held-limit log reports. held()
  // read later can already be lower (views are released on other threads). Consumer thread.
  uint32_t held_at_refusal() const { return held_at_refusal_; }
  uint32_t max_held() const { return max_held_; }
  const std::string& sender() const { return sender_; }
  bool registered(std::span<const std::byte> bytes) const;
  protocol::ReceiverProtocol& protocol() { return *proto_; }
  // Waits until a unit is given back or `timeout` passes: the consumer at the held limit sleeps here
  // instead of polling, so that on a shared core the thread that reads and releases the views runs.
  void wait_release(std::chrono::microseconds timeout);

 private:
  friend struct BlockLease;
  void released();
  std::string sender_;
  // Declared before the protocol: its region is unmapped through the context.
  std::shared_ptr<fabric::Context> context_;
  std::shared_ptr<protocol::ReceiverProtocol> proto_;
  uint32_t max_held_;
  std::atomic<uint32_t> held_{0};
  uint32_t held_at_refusal_ = 0;  // consumer thread
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  uint64_t releases_ = 0;  // guarded by release_mu_
};

// The delivery's sink in zero-copy mode. Threading: the consumer's (one sender's session).
class LendingSink final : public MessageSink {
 public:
  LendingSink(std::shared_ptr<Lending> lending, std::unique_ptr<ViewSink> views);
  // Lends batch[k] in place under leases[k] (nullptr: it is copied). Contract of deliver().
  Status lend(std::span<const Message> batch, std::span<const std::shared_ptr<BlockLease>> leases, size_t* stored);
  // Copies (records copied aside while their device was paused).
  Status deliver(std::span<const Message> batch, size_t* stored) override;
  // A message that spans blocks: assembled in one copy, lent on commit.
  Status begin(uint16_t device) override;
  Status append(uint16_t device, std::span<const std::byte> data) override;
  Status commit(uint16_t device) override;
  void abort(uint16_t device) override;
  // The packet number of the message the next begin() starts (MessageView::packet()).
  void set_first_packet(uint32_t packet) { first_packet_ = packet; }
  uint64_t lent() const { return lent_; }
  const std::shared_ptr<Lending>& lending() const { return lending_; }

 private:
  struct Open {
    uint16_t device = 0;
    uint32_t packet = 0;
    std::shared_ptr<CopyLease> copy;
  };
  Open* find(uint16_t device);
  Status hand(MessageView& view);
  std::shared_ptr<Lending> lending_;
  std::unique_ptr<ViewSink> views_;
  std::vector<Open> open_;  // messages being assembled, per device
  uint64_t lent_ = 0;       // views lent in place
  uint32_t first_packet_ = 0;
};

}  // namespace slotstream::stream
