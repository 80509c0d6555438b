#include "engine/ucx/fabric/soft_rma.h"

#include <atomic>

#include <ucp/api/ucp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <iterator>

#include <spdlog/spdlog.h>

#include "engine/ucx/fabric/internal.h"

namespace slotstream::fabric {
namespace {

// Active-message ids the fabric keeps for itself (protocols use small ones: sliding_window 11, 12).
constexpr unsigned kGetReq = 200;
constexpr unsigned kGetRep = 201;
constexpr unsigned kPut = 202;
constexpr unsigned kFlushReq = 203;
constexpr unsigned kFlushAck = 204;
constexpr unsigned kPutFlag = 205;
// A get's reply goes in chunks of at most this: no message larger than this is ever assembled.
constexpr uint64_t kChunk = 256 * 1024;

struct GetReq {
  uint64_t id, address, length;
};
struct GetRep {
  uint64_t id, offset;
  uint32_t status, zero;  // status: 0 ok, 1 refused (outside registered memory)
};
struct Put {
  uint64_t address, length;
};
struct PutFlag {
  uint64_t address, length, flag_address;
  uint32_t flag_length, zero;
  uint64_t flag;  // the flag's bytes, first flag_length of them
};
struct FlushMsg {
  uint64_t id;
};
static_assert(sizeof(GetReq) == 24 && sizeof(GetRep) == 24 && sizeof(Put) == 16 && sizeof(PutFlag) == 40 &&
              sizeof(FlushMsg) == 8);
static_assert(std::endian::native == std::endian::little, "headers are copied as little-endian structs");

template <typename T>
bool read_header(const void* header, size_t len, T* out) {
  if (len != sizeof(T)) return false;
  std::memcpy(out, header, sizeof(T));
  return true;
}

ucs_status_ptr_t am_send(ucp_ep_h ep, unsigned id, const void* header, size_t header_len, const void* data,
                         size_t length, uint32_t flags) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = flags;
  internal::count_am_send();
  return ucp_am_send_nbx(ep, id, header, header_len, data, length, &param);
}

}  // namespace

Status SoftRma::create(Worker& worker, std::unique_ptr<SoftRma>* out) {
  std::unique_ptr<SoftRma> s(new SoftRma(worker));
  SoftRma* self = s.get();
  auto install = [&](unsigned id, ucp_am_recv_callback_t cb) {
    ucp_am_handler_param_t p{};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.id = id;
    p.cb = cb;
    p.arg = self;
    return internal::from_ucs(ucp_worker_set_am_recv_handler(worker.handle(), &p), "ucp_worker_set_am_recv_handler");
  };
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kGetReq, [](void* arg, const void* h, size_t hl, void*, size_t, const ucp_am_recv_param_t* p) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_get_request(
            h, hl, (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? p->reply_ep : nullptr);
        return UCS_OK;
      }));
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kGetRep,
      [](void* arg, const void* h, size_t hl, void* d, size_t dl, const ucp_am_recv_param_t* p) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_get_reply(h, hl, d, dl, p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
        return UCS_OK;
      }));
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kPut, [](void* arg, const void* h, size_t hl, void* d, size_t dl, const ucp_am_recv_param_t* p) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_put(h, hl, d, dl, p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
        return UCS_OK;
      }));
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kPutFlag,
      [](void* arg, const void* h, size_t hl, void* d, size_t dl, const ucp_am_recv_param_t* p) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_put_flag(h, hl, d, dl, p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
        return UCS_OK;
      }));
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kFlushReq, [](void* arg, const void* h, size_t hl, void*, size_t, const ucp_am_recv_param_t* p) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_flush_request(
            h, hl, (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? p->reply_ep : nullptr);
        return UCS_OK;
      }));
  SLOTSTREAM_RETURN_IF_ERROR(install(
      kFlushAck, [](void* arg, const void* h, size_t hl, void*, size_t, const ucp_am_recv_param_t*) -> ucs_status_t {
        static_cast<SoftRma*>(arg)->on_flush_ack(h, hl);
        return UCS_OK;
      }));
  *out = std::move(s);
  return Status::ok();
}

// Requests are freed with mutex_ released (here and in reap): ucp_request_free takes a shared
// worker's lock, which a thread in ucp_worker_progress holds while our handlers take mutex_ — the
// opposite order (ThreadSanitizer: lock-order inversion, a possible deadlock of two threads).
SoftRma::~SoftRma() {
  std::list<Reply> replies;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, op] : ops_) finish_op(*op, {Code::kCancelled, "worker destroyed"});
    ops_.clear();
    replies.swap(replies_);
  }
  // UCX completes (or purges) these later and reads their headers until then: a header of a send
  // still running is left behind (only sends to a peer that stopped answering are), and so is the
  // memory its data comes from (unmapped with the context).
  for (Reply& r : replies) {
    const bool running = ucp_request_check_status(r.req) == UCS_INPROGRESS;
    if (running) (void)r.header.release();
    ucp_request_free(r.req);
    if (!running && r.in_flight != 0) worker_.context().done_in_flight(r.in_flight);
  }
}

void SoftRma::finish_op(SoftOp& op, const Status& st) {
  if (op.state.load(std::memory_order_relaxed) != SoftOp::kPending) return;
  if (op.send_req != nullptr) {
    // Its header is read until it is sent; reap() frees the request (not here: mutex_ is held).
    replies_.push_back({op.send_req, std::move(op.header)});
    reply_count_.store(replies_.size(), std::memory_order_relaxed);
    op.send_req = nullptr;
  }
  op.error = st;
  op.state.store(st.is_ok() ? SoftOp::kDone : SoftOp::kFailed, std::memory_order_release);
}

Status SoftRma::send_op(Endpoint& ep, unsigned id, std::shared_ptr<SoftOp> op, const void* header, size_t header_len,
                        const void* data, size_t length, uint32_t flags, std::shared_ptr<SoftOp>* out) {
  op->endpoint = &ep;
  op->owner = this;
  op->header = std::make_unique<uint8_t[]>(header_len);
  std::memcpy(op->header.get(), header, header_len);
  std::unique_lock lock(mutex_);
  if (op->awaits_reply) {
    op->id = next_id_++;
    std::memcpy(op->header.get(), &op->id, sizeof op->id);  // every request header starts with its id
    ops_[op->id] = op;
  }
  // Sent without the lock: a reply may be handled inside the call, and its handler takes it.
  lock.unlock();
  ucs_status_ptr_t p = am_send(ep.handle(), id, op->header.get(), header_len, data, length, flags);
  lock.lock();
  if (UCS_PTR_IS_ERR(p)) {
    if (op->awaits_reply) ops_.erase(op->id);
    return internal::from_ucs(UCS_PTR_STATUS(p), id == kPut ? "put" : "get");
  }
  if (p != nullptr && op->state.load(std::memory_order_relaxed) == SoftOp::kPending) {
    op->send_req = p;
  } else if (p != nullptr) {
    replies_.push_back({p, std::move(op->header)});  // answered already, its message still being sent
    reply_count_.store(replies_.size(), std::memory_order_relaxed);
  }
  if (!op->awaits_reply && p == nullptr) finish_op(*op, Status::ok());  // sent inside the call
  *out = std::move(op);
  return Status::ok();
}

Status SoftRma::get(Endpoint& ep, void* dst, size_t length, uint64_t address, Request* req) {
  auto op = std::make_shared<SoftOp>();
  op->dst = static_cast<std::byte*>(dst);
  op->length = length;
  const GetReq h{0, address, length};
  std::shared_ptr<SoftOp> sent;
  SLOTSTREAM_RETURN_IF_ERROR(
      send_op(ep, kGetReq, std::move(op), &h, sizeof h, nullptr, 0, UCP_AM_SEND_FLAG_REPLY, &sent));
  *req = Request(std::move(sent));
  return Status::ok();
}

Status SoftRma::send_put(Endpoint& ep, unsigned id, const void* header, size_t header_len, const void* src,
                         size_t length, Request* req) {
  auto op = std::make_shared<SoftOp>();
  op->awaits_reply = false;
  std::shared_ptr<SoftOp> sent;
  SLOTSTREAM_RETURN_IF_ERROR(
      send_op(ep, id, std::move(op), header, header_len, src, length, UCP_AM_SEND_FLAG_EAGER, &sent));
  if (sent->state.load(std::memory_order_acquire) == SoftOp::kPending) *req = Request(std::move(sent));
  return Status::ok();
}

Status SoftRma::put(Endpoint& ep, const void* src, size_t length, uint64_t address, Request* req) {
  const Put h{address, length};
  return send_put(ep, kPut, &h, sizeof h, src, length, req);
}

// `flag_length` was checked by Endpoint::put_flagged.
Status SoftRma::put_flagged(Endpoint& ep, const void* src, size_t length, uint64_t address, const void* flag,
                            size_t flag_length, uint64_t flag_address, Request* req) {
  PutFlag h{address, length, flag_address, uint32_t(flag_length), 0, 0};
  std::memcpy(&h.flag, flag, flag_length);
  return send_put(ep, kPutFlag, &h, sizeof h, src, length, req);
}

Status SoftRma::flush(Endpoint& ep, const Liveness& alive) {
  const FlushMsg h{0};
  std::shared_ptr<SoftOp> sent;
  SLOTSTREAM_RETURN_IF_ERROR(
      send_op(ep, kFlushReq, std::make_shared<SoftOp>(), &h, sizeof h, nullptr, 0, UCP_AM_SEND_FLAG_REPLY, &sent));
  Request req(std::move(sent));
  return req.wait(worker_, alive);
}

int SoftRma::check(SoftOp& op) {
  const int state = op.state.load(std::memory_order_acquire);
  if (state != SoftOp::kPending || op.awaits_reply) return state;
  std::lock_guard lock(mutex_);
  if (op.send_req != nullptr) {
    const ucs_status_t st = ucp_request_check_status(op.send_req);
    if (st == UCS_INPROGRESS) return SoftOp::kPending;
    finish_op(op, internal::from_ucs(st, "put"));
  }
  return op.state.load(std::memory_order_acquire);
}

void SoftRma::fail_endpoint(const Endpoint* ep, const Status& why) {
  std::lock_guard lock(mutex_);
  for (auto it = ops_.begin(); it != ops_.end();) {
    if (it->second->endpoint == ep) {
      finish_op(*it->second, why);
      it = ops_.erase(it);
    } else {
      ++it;
    }
  }
}

void SoftRma::forget(SoftOp* op) {
  std::lock_guard lock(mutex_);
  if (op->awaits_reply) {
    auto it = ops_.find(op->id);
    if (it != ops_.end() && it->second.get() == op) ops_.erase(it);
  }
  finish_op(*op, {Code::kCancelled, "dropped"});  // a message still being sent keeps its header
}

void SoftRma::reap() {
  if (reply_count_.load(std::memory_order_relaxed) == 0) return;  // every progress call: stay cheap
  std::list<Reply> done;
  {
    std::lock_guard lock(mutex_);
    for (auto it = replies_.begin(); it != replies_.end();) {
      const auto next = std::next(it);
      if (ucp_request_check_status(it->req) != UCS_INPROGRESS) done.splice(done.end(), replies_, it);
      it = next;
    }
    reply_count_.store(replies_.size(), std::memory_order_relaxed);
  }
  for (Reply& r : done) {
    ucp_request_free(r.req);  // with mutex_ released (see ~SoftRma)
    if (r.in_flight != 0) worker_.context().done_in_flight(r.in_flight);
  }
}

void SoftRma::reply(void* reply_ep, unsigned id, const void* header, size_t header_len, const void* data,
                    size_t length) {
  if (reply_ep == nullptr) return;
  auto copy = std::make_unique<uint8_t[]>(header_len);
  std::memcpy(copy.get(), header, header_len);
  ucs_status_ptr_t p =
      am_send(static_cast<ucp_ep_h>(reply_ep), id, copy.get(), header_len, data, length, UCP_AM_SEND_FLAG_EAGER);
  if (UCS_PTR_IS_ERR(p)) {
    // The initiator is gone (or going): nothing to answer. This is the case UCX's own emulation
    // turns into an abort.
    spdlog::debug("fabric: reply to a peer failed: {}", ucs_status_string(UCS_PTR_STATUS(p)));
    return;
  }
  if (p == nullptr) return;
  // Still being sent, from the peer's readable memory: its owner may release it meanwhile (a receiver
  // that stops), and the queued reply would read it after it was unmapped.
  const uint64_t ticket = length > 0 ? worker_.context().in_flight(reinterpret_cast<uint64_t>(data), length) : 0;
  std::lock_guard lock(mutex_);
  replies_.push_back({p, std::move(copy), ticket});
  reply_count_.store(replies_.size(), std::memory_order_relaxed);
}

void SoftRma::on_get_request(const void* header, size_t header_len, void* reply_ep) {
  internal::count_am_received();
  GetReq h;
  if (!read_header(header, header_len, &h)) return;
  // Checked and handed to the send calls under one hold of the registrations.
  const auto hold = worker_.context().hold_registrations();
  const bool ok = worker_.context().registered_held(h.address, h.length);
  if (!ok)
    spdlog::warn("fabric: refused a peer's read of {} bytes at 0x{:x}: not registered memory", h.length, h.address);
  const auto* src = reinterpret_cast<const std::byte*>(h.address);
  uint64_t offset = 0;
  do {
    const uint64_t n = ok ? std::min(kChunk, h.length - offset) : 0;
    GetRep rep{h.id, offset, ok ? 0u : 1u, 0u};
    reply(reply_ep, kGetRep, &rep, sizeof rep, ok ? src + offset : nullptr, n);
    offset += n;
  } while (ok && offset < h.length);
}

void SoftRma::on_get_reply(const void* header, size_t header_len, const void* data, size_t length, bool rndv) {
  internal::count_am_received();
  GetRep h;
  if (!read_header(header, header_len, &h)) return;
  std::lock_guard lock(mutex_);
  auto it = ops_.find(h.id);
  if (it == ops_.end()) return;  // dropped, or its endpoint failed: the data has nowhere to go
  SoftOp& op = *it->second;
  if (h.status != 0) {
    finish_op(op, {Code::kProtocolError, "the peer refused the read (outside its registered memory)"});
  } else if (rndv || h.offset > op.length || length > op.length - h.offset) {
    finish_op(op, {Code::kProtocolError, "malformed read reply"});
  } else {
    std::memcpy(op.dst + h.offset, data, length);
    op.received += length;
    if (op.received < op.length) return;
    finish_op(op, Status::ok());
  }
  ops_.erase(it);
}

bool SoftRma::writable(uint64_t address, uint64_t length) const {  // with the registrations held
  if (worker_.context().registered_held(address, length)) return true;
  spdlog::warn("fabric: refused a peer's write of {} bytes at 0x{:x}: not registered memory", length, address);
  return false;
}

void SoftRma::on_put(const void* header, size_t header_len, const void* data, size_t length, bool rndv) {
  internal::count_am_received();
  Put h;
  if (!read_header(header, header_len, &h) || rndv || h.length != length) return;
  const auto hold = worker_.context().hold_registrations();  // the region cannot go between check and write
  if (!writable(h.address, h.length)) return;
  place(reinterpret_cast<std::byte*>(h.address), static_cast<const std::byte*>(data), length);
}

void SoftRma::on_put_flag(const void* header, size_t header_len, const void* data, size_t length, bool rndv) {
  internal::count_am_received();
  PutFlag h;
  if (!read_header(header, header_len, &h) || rndv || h.length != length) return;
  if (h.flag_length == 0 || h.flag_length > sizeof h.flag || !std::has_single_bit(h.flag_length)) return;
  // Both checked before either is written: a refused flag must not follow placed data, nor the reverse. Under one
  // hold of the registrations: the region cannot go between the check and the writes.
  const auto hold = worker_.context().hold_registrations();
  if (!writable(h.address, h.length) || !writable(h.flag_address, h.flag_length)) return;
  place(reinterpret_cast<std::byte*>(h.address), static_cast<const std::byte*>(data), length);
  place(reinterpret_cast<std::byte*>(h.flag_address), reinterpret_cast<const std::byte*>(&h.flag), h.flag_length);
}

// These bytes stand for a NIC's DMA write into exposed memory: the protocols order them the way
// they order an RNIC's (data, fence, then the flag they poll with acquire loads; the AMs carrying
// them arrive and are handled in that order, on one thread). A write of one aligned word (1, 2, 4
// or 8 bytes: a status byte, a counter, a tail) is a release store — what a flag is — so a reader's
// acquire load of it sees every earlier placement of this thread, in the C++ memory model as on
// the wire; anything longer is data, copied after a release fence (in-order placement on weakly
// ordered CPUs, as a NIC's).
void SoftRma::place(std::byte* dst, const std::byte* src, size_t length) {
  const auto aligned = [&](size_t n) { return length == n && reinterpret_cast<uintptr_t>(dst) % n == 0; };
  auto store = [&]<typename T>(T) {
    T v;
    std::memcpy(&v, src, sizeof v);
    std::atomic_ref<T>(*reinterpret_cast<T*>(dst)).store(v, std::memory_order_release);
  };
  if (aligned(1)) return store(uint8_t{});
  if (aligned(2)) return store(uint16_t{});
  if (aligned(4)) return store(uint32_t{});
  if (aligned(8)) return store(uint64_t{});
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(dst, src, length);
}

void SoftRma::on_flush_request(const void* header, size_t header_len, void* reply_ep) {
  internal::count_am_received();
  FlushMsg h;
  if (!read_header(header, header_len, &h)) return;
  reply(reply_ep, kFlushAck, &h, sizeof h, nullptr, 0);
}

void SoftRma::on_flush_ack(const void* header, size_t header_len) {
  internal::count_am_received();
  FlushMsg h;
  if (!read_header(header, header_len, &h)) return;
  std::lock_guard lock(mutex_);
  auto it = ops_.find(h.id);
  if (it == ops_.end()) return;
  finish_op(*it->second, Status::ok());
  ops_.erase(it);
}

}  // namespace slotstream::fabric
