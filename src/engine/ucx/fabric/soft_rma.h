// Puts and gets over tcp, carried by the fabric with active messages instead of by UCX.
//
// Why: tcp has no one-sided transport, so UCX emulates RMA in software — and in UCX 1.13 (still so
// upstream) the *target* of that emulation aborts the whole process when the initiator dies while
// the target answers: the reply to a get, or the completion of a put, fails with "Endpoint
// timeout" and ucp_request_try_send() calls ucs_fatal ("unexpected error"), or a queued reply is
// purged through an asserting stub. A receiver killed mid-stream then takes a buffered_read
// sender (the target of its reads) down with SIGABRT in ~3% of kills, and a status_byte sender
// killed during a status-array read could take the receiver daemon down the same way. Here a reply
// that cannot be sent is an error the fabric drops, never an abort.
//
// What it costs: nothing the caller sees. The target's worker must still be progressed (as for
// UCX's emulation), and it serves reads and writes only inside memory registered through its
// Context (UCX's emulation serves any address). A get that is dropped before its reply arrived
// (Request destroyed) never writes its destination afterwards.
//
// Active messages (ids kGetReq..kFlushAck, little-endian headers, defined in soft_rma.cc):
//   GET_REQ   u64 id | u64 address | u64 length               initiator -> target (with reply ep)
//   GET_REP   u64 id | u64 offset | u32 status | u32 zero + data, in chunks of kChunk bytes
//   PUT       u64 address | u64 length + data                  initiator -> target
//   PUT_FLAG  u64 address | u64 length | u64 flag address | u32 flag length | u32 zero | u64 flag
//             + data: the data placed, then the flag word (Endpoint::put_flagged)
//   FLUSH_REQ u64 id                                           after every PUT before it, in order
//   FLUSH_ACK u64 id                                           so flush() means remote completion
//
// Threading: as its Worker (a shared worker's handlers run on whichever thread progresses it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/ucx/fabric/fabric.h"

namespace slotstream::fabric {

// One operation in flight. A get or flush completes when its reply (every chunk) arrived; a put
// when its message was sent (its source may be reused). Or it fails.
struct SoftOp {
  std::atomic<int> state{0};  // kPending, then kDone or kFailed (release: fields below are set)
  Status error;
  bool awaits_reply = true;  // get, flush; false: put
  std::byte* dst = nullptr;
  uint64_t length = 0;
  uint64_t received = 0;
  uint64_t id = 0;
  const Endpoint* endpoint = nullptr;
  SoftRma* owner = nullptr;
  void* send_req = nullptr;           // the message's UCX request while it is being sent
  std::unique_ptr<uint8_t[]> header;  // the message's header, alive until it was sent
  static constexpr int kPending = 0, kDone = 1, kFailed = 2;
};

class SoftRma {
 public:
  // Registers the handlers on `worker` (its context's wire is tcp).
  static Status create(Worker& worker, std::unique_ptr<SoftRma>* out);
  ~SoftRma();

  Status get(Endpoint& ep, void* dst, size_t length, uint64_t address, Request* req);
  Status put(Endpoint& ep, const void* src, size_t length, uint64_t address, Request* req);
  Status put_flagged(Endpoint& ep, const void* src, size_t length, uint64_t address, const void* flag,
                     size_t flag_length, uint64_t flag_address, Request* req);
  // Every put issued on `ep` before it has been applied by the target.
  Status flush(Endpoint& ep, const Liveness& alive);
  // The endpoint failed or goes away: its operations fail (a late reply is discarded).
  void fail_endpoint(const Endpoint* ep, const Status& why);
  // The state of `op` now (a put's send is checked here).
  int check(SoftOp& op);
  // A Request was dropped while its op was pending.
  void forget(SoftOp* op);
  // Frees the replies whose sending finished (called from Worker::progress).
  void reap();

 private:
  explicit SoftRma(Worker& worker) : worker_(worker) {}
  // Sends the message of a new op; `*out` is set unless it failed at once.
  Status send_op(Endpoint& ep, unsigned id, std::shared_ptr<SoftOp> op, const void* header, size_t header_len,
                 const void* data, size_t length, uint32_t flags, std::shared_ptr<SoftOp>* out);
  void finish_op(SoftOp& op, const Status& st);  // with mutex_ held
  void on_get_request(const void* header, size_t header_len, void* reply_ep);
  void on_get_reply(const void* header, size_t header_len, const void* data, size_t length, bool rndv);
  void on_put(const void* header, size_t header_len, const void* data, size_t length, bool rndv);
  void on_put_flag(const void* header, size_t header_len, const void* data, size_t length, bool rndv);
  // Sends a put-like message whose op completes once it was sent.
  Status send_put(Endpoint& ep, unsigned id, const void* header, size_t header_len, const void* src, size_t length,
                  Request* req);
  // Whether a peer may write [address, address + length) (logs a refusal).
  bool writable(uint64_t address, uint64_t length) const;
  // Writes a peer's put into exposed memory (the emulated NIC's placement).
  static void place(std::byte* dst, const std::byte* src, size_t length);
  void on_flush_request(const void* header, size_t header_len, void* reply_ep);
  void on_flush_ack(const void* header, size_t header_len);
  // Sends a reply and keeps its header until the send completed (or failed: then dropped); the
  // registered memory its data comes from stays mapped until then (Context::in_flight). Called
  // with the registrations held.
  void reply(void* reply_ep, unsigned id, const void* header, size_t header_len, const void* data, size_t length);

  Worker& worker_;
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<SoftOp>> ops_;
  uint64_t next_id_ = 1;
  struct Reply {
    void* req = nullptr;
    std::unique_ptr<uint8_t[]> header;
    uint64_t in_flight = 0;  // a get's reply: its data's ticket (Context::in_flight), 0 for none
  };
  std::list<Reply> replies_;            // replies still being sent
  std::atomic<size_t> reply_count_{0};  // replies_.size(), read without the lock by reap()
};

}  // namespace slotstream::fabric
