// The UCX boundary. Only src/engine/ucx/fabric/*.cc includes <ucp/api/ucp.h>; everything above speaks these
// RAII types. Each wrapper owns one UCX handle and destroys it in its destructor.
//
// Threading: a Context is shared. A Worker created with `shared = false` is used by one thread at
// a time, which the caller serializes (a sender lane's transmit token); `shared = true` (the
// receiver's) may be used by its progress thread and by set-up threads at once. Endpoint/RemoteKey/Request follow their
// Worker.
#pragma once

#ifdef SLOTSTREAM_UCX_FREE
#error "the datagram engine (src/engine/dgram) is UCX-free: it must not include the UCX wrapper (src/engine/ucx/fabric)"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/ucx/fabric/transports.h"
#include "slotstream/slotstream.h"
#include "slotstream/status.h"

struct ucp_context;
struct ucp_worker;
struct ucp_ep;
struct ucp_mem;
struct ucp_rkey;

namespace slotstream::fabric {

// Owns a UCX handle: the deleter is its UCX destroy call (defined in fabric.cc; only src/engine/ucx/fabric's .cc
// files include UCX). Handles never leave src/engine/ucx/fabric.
struct UcxDestroy {
  void operator()(ucp_context* h) const;
  void operator()(ucp_worker* h) const;
  void operator()(ucp_rkey* h) const;
};
template <typename T>
using UcxHandle = std::unique_ptr<T, UcxDestroy>;

// What this process asked of UCX, counted where the calls are made (for the benchmark's
// resource experiment). Process-wide; reset_counters() starts a new measurement.
struct Counters {
  uint64_t endpoints = 0;         // endpoints created
  uint64_t registered_bytes = 0;  // largest amount of memory registered at once
  uint64_t puts = 0;
  uint64_t gets = 0;
  uint64_t am_sends = 0;
  uint64_t am_received = 0;      // two-sided messages handled (receives consumed)
  uint64_t tag_sends = 0;        // tagged two-sided sends (Endpoint::tag_send)
  uint64_t tag_receives = 0;     // tagged receives posted (Worker::tag_recv)
  uint64_t tag_unexpected = 0;   // ...of which found their message already waiting in UCX
  uint64_t max_outstanding = 0;  // most operations in flight at once (tracked requests)
  uint64_t completions = 0;      // requests whose completion had to be polled
  // ucp_worker_progress calls (by any thread: a sending thread, a consumer, a progress thread)
  // and the time spent inside them: the CPU a side gives to its transport. Zero on a receiver
  // that takes no part in transfers (status_byte on shared memory).
  uint64_t progress_calls = 0;
  uint64_t progress_useful = 0;  // calls that found something to do
  uint64_t progress_ns = 0;
  // Progress calls made only while a peer connected (Worker::progress_setup: rc's wire-up is
  // answered by the target's worker), not counted above: before the data path starts.
  uint64_t setup_progress_calls = 0;
};
Counters counters();
void reset_counters();

// What the NICs pin for this process now, as estimated before anything is pinned (the kernel
// counts it against RLIMIT_MEMLOCK per process): the regions of every context that registers
// memory, and per worker of those what UCX pins for its own buffers (worker_pinned_bytes). A
// locked-memory check (check_memlock) adds what is about to be pinned to it; Worker::create and
// MemoryRegion::allocate/map check before UCX pins. Any thread.
uint64_t pinned_estimate();

// A test hook: where SLOTSTREAM_TEST_STOP_AT names `point` (a comma-separated list), the process
// says so on stderr ("slotstream: stopped at POINT") and stops itself with SIGSTOP there, so that a
// test can kill it at exactly that moment of a connection (tests/rdma: a peer killed at each
// phase). Points: hello, accept, wireup, data, fin (docs/rdma.md). Costs one flag test otherwise.
void test_stop_point(const char* point);

// Called periodically inside blocking waits; a non-ok result aborts the wait with that status.
// This is how a sender notices a dead receiver on shared memory, where UCX never reports it.
using Liveness = std::function<Status()>;

class MemoryRegion;

class Context {
 public:
  // `spec` (never kAuto) is which UCX transports it may use (transports.h). The protocols never
  // look at it; only the fabric does, to configure UCX.
  static Status create(const FabricSpec& spec, std::unique_ptr<Context>* out);
  static Status create(Transport transport, std::unique_ptr<Context>* out) {
    return create(FabricSpec{transport}, out);
  }
  ~Context();  // unmaps parked regions, then cleans up (every worker must be gone by then)
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Transport transport() const { return spec_.transport; }
  const FabricSpec& spec() const { return spec_; }
  TransportTraits traits() const { return fabric::traits(spec_); }
  // The UCX settings of the user's environment that replaced the fabric's own (transports.h),
  // for the CLI to report: empty when the environment changed nothing.
  const std::vector<std::string>& ucx_overrides() const { return overrides_; }
  // Bytes registered through this context now (what the NIC pins on rdma). Any thread.
  uint64_t registered_bytes() const;
  // Whether [address, address + length) lies in one memory region registered through this
  // context: what a peer may read or write where the fabric carries puts and gets (soft_rma.h).
  // Any thread.
  bool registered(uint64_t address, uint64_t length) const;
  // Keeps every registration as it is while held: a MemoryRegion leaves the registrations under the
  // same lock before its memory is unmapped, so memory found registered_held() stays mapped until the
  // hold ends. A peer's put or get is checked and applied under one hold (soft_rma.cc): checked, then
  // applied after the lock was let go, it wrote into a region its owner had freed in between.
  std::shared_lock<std::shared_mutex> hold_registrations() const { return std::shared_lock(regions_mutex_); }
  bool registered_held(uint64_t address, uint64_t length) const;  // with hold_registrations() held

  // Keeps `region` mapped until this context goes, i.e. until after every worker of it: for
  // memory a peer may still write into after its owner gave up on it (a receive still being
  // filled, a word the peer still puts into). UCX must not write into unmapped memory, and it
  // refuses to clean up while memory is still mapped, so such memory is neither freed nor leaked.
  // Any thread.
  void park(std::unique_ptr<MemoryRegion> region);

  // Memory that a message still being sent reads from: the reply to a peer's get leaves from the
  // target's exposed region (soft_rma.cc), and over tcp it waits in UCX's queue for as long as the
  // peer reads slowly. While [address, address + length) is in flight, a region that allocate() made
  // is not unmapped when its owner releases it, but when the last send reading it ended (or with the
  // context): unmapped under a queued reply, it was read after it was gone. in_flight() returns the
  // ticket that done_in_flight() ends. Any thread.
  uint64_t in_flight(uint64_t address, uint64_t length);
  void done_in_flight(uint64_t ticket);
  // Released regions whose unmapping waits for a send (for tests and counters).
  size_t unmaps_waiting() const;

 private:
  friend class MemoryRegion;
  friend class Worker;
  struct InFlight {
    uint64_t ticket, address, length;
  };
  struct WaitingUnmap {
    ucp_mem* mem;
    uint64_t address, length;
  };
  bool in_flight_within(uint64_t address, uint64_t length) const;  // with flight_mutex_ held
  void unmap(ucp_mem* mem, uint64_t length);
  Context(ucp_context* handle, FabricSpec spec, std::vector<std::string> overrides)
      : handle_(handle),
        spec_(std::move(spec)),
        overrides_(std::move(overrides)) {}
  ucp_context* handle() const { return handle_.get(); }
  UcxHandle<ucp_context> handle_;
  FabricSpec spec_;
  std::vector<std::string> overrides_;
  bool zero_filled_ = false;                            // UCX allocates only zero-filled pages (MemoryRegion::allocate)
  mutable std::shared_mutex regions_mutex_;             // shared: holds (puts, gets); exclusive: regions come and go
  std::vector<std::pair<uint64_t, uint64_t>> regions_;  // (address, length) of live MemoryRegions
  std::mutex parked_mutex_;
  std::vector<std::unique_ptr<MemoryRegion>> parked_;
  mutable std::mutex flight_mutex_;  // after regions_mutex_ where both are taken
  std::vector<InFlight> in_flight_;
  std::vector<WaitingUnmap> waiting_unmaps_;
  uint64_t next_ticket_ = 1;
};

class Worker;

// Registered memory. `allocate` lets UCX allocate it (UCP_MEM_MAP_ALLOCATE): on shared memory
// that is what makes remote puts/gets land without the owner's CPU (see docs/design.md).
// `map` registers memory the caller owns and keeps (the local destination of gets: shared memory
// and tcp copy into any memory, an RDMA NIC only into registered memory); it stays the caller's.
struct ExposedRegion;

class MemoryRegion {
 public:
  static Status allocate(Context& ctx, size_t length, std::unique_ptr<MemoryRegion>* out);
  // allocate() and the packed remote key a peer unpacks (RemoteKey::unpack): the memory a
  // protocol exposes to its peer at set-up.
  static Status allocate_exposed(Context& ctx, size_t length, ExposedRegion* out);
  static Status map(Context& ctx, void* address, size_t length, std::unique_ptr<MemoryRegion>* out);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t remote_address() const { return reinterpret_cast<uint64_t>(data_); }
  // Packed remote key for a peer to unpack.
  Status pack_rkey(std::vector<uint8_t>* out) const;

 private:
  MemoryRegion(Context& ctx, ucp_mem* mem, std::byte* data, size_t size, bool allocated)
      : ctx_(ctx),
        mem_(mem),
        data_(data),
        size_(size),
        allocated_(allocated) {}
  Context& ctx_;
  ucp_mem* mem_;  // not a UcxHandle: unmapping needs the context (and updates its region list)
  std::byte* data_;
  size_t size_;
  bool allocated_;  // allocate(): UCX's memory, kept mapped while a send reads it; map(): the caller's
};

class Endpoint;

// A peer's region as this side reaches it. Where UCX maps the region into this process
// (ucp_rkey_ptr: shared memory, whose segments UCX attaches when it unpacks the key), the
// endpoint's puts and gets through this key are plain copies into and out of that mapping,
// completed on return, and a flag is a release store: what UCX's shared-memory transports do
// inside ucp_put_nbx, without the request machinery around it. Elsewhere (tcp, rdma: no
// mapping) they go through UCX or the fabric's own carrier as before. Every region a peer
// exposes comes from MemoryRegion::allocate, so on one transport all keys map or none: a copy is
// never issued behind a UCX put to the same peer that is still in flight (Worker::fence orders
// UCX's operations, not these copies, which are done when they return).
class RemoteKey {
 public:
  static Status unpack(Endpoint& ep, std::span<const uint8_t> packed, std::unique_ptr<RemoteKey>* out);
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ~RemoteKey() = default;

  // Whether this process reaches the region through a mapping (tests, diagnostics). Asks UCX
  // once, at `remote_addr`.
  bool mapped(uint64_t remote_addr) { return local(remote_addr) != nullptr; }

 private:
  friend class Endpoint;
  explicit RemoteKey(ucp_rkey* handle) : handle_(handle) {}
  ucp_rkey* handle() const { return handle_.get(); }
  // Where `remote_addr` is mapped in this process, or null where UCX maps nothing (known after
  // the first refusal; the key's whole region is mapped or none of it).
  std::byte* local(uint64_t remote_addr);
  UcxHandle<ucp_rkey> handle_;
  std::atomic<bool> unmapped_{false};  // relaxed: set once, and a stale false only asks UCX again
};

struct SoftOp;
class SoftRma;
class CmListener;

// How Request::wait spends the start of a wait, from the completion times it observed on the
// worker (pure, so that it is tested without a peer). A completion that comes in microseconds
// (shared memory, RDMA: the NIC or the CPU copies) is spun for: sleeping would only add a
// wake-up. One that takes a round trip through a peer's thread (a get the fabric carries itself,
// soft_rma.h: tens of µs) is slept for in the worker's event wait, which the answer ends: a spin
// there burns a core on progress calls for the whole round trip, and may take the core the
// peer's thread needs to answer.
namespace wait_policy {
// Typical completions at or above this are answers from a peer's thread, not local progress.
// Measured status reads: shm ~0.1 µs; RDMA 5.1 µs (the paper's Fig. 10, two hosts); tcp over
// loopback 18 µs when the sender sleeps for it, 25-140 µs when it spins (its spin takes the core
// the receiver's progress thread needs on two cores).
constexpr std::chrono::nanoseconds kPeerRoundTrip = std::chrono::microseconds(10);
constexpr std::chrono::nanoseconds kMaxSpin = std::chrono::microseconds(100);
// The spin before sleeping, given the typical completion so far (0: none seen yet).
constexpr std::chrono::nanoseconds spin_budget(std::chrono::nanoseconds typical) {
  return typical >= kPeerRoundTrip ? std::chrono::nanoseconds(0) : kMaxSpin;
}
// The typical completion after one more `sample`: a moving average (weight 1/4) in which a sample
// counts as at most twice the typical (a rise of at most 1.25x per sample), so that one wait stretched by preemption
// (milliseconds on a busy host) does not turn a fabric that completes in microseconds into one that is slept for.
constexpr std::chrono::nanoseconds update_typical(std::chrono::nanoseconds typical, std::chrono::nanoseconds sample) {
  if (typical.count() <= 0) return sample;
  const auto s = std::min(sample, 2 * typical);
  return typical + (s - typical) / 4;
}
}  // namespace wait_policy

// An outstanding non-blocking operation. Empty when the operation completed inside the call.
// Dropping a pending one is allowed: UCX frees its request when it completes, and a get the
// fabric carries itself (tcp, soft_rma.h) no longer writes its destination. A UCX get still
// running when it is dropped (rdma: the NIC writes its destination whenever the answer comes)
// ends before the drop returns: its endpoint is closed, which ends every operation on it, and the
// worker progressed until this one has (Endpoint::abandon) — its owner may free the destination
// next. (A get is dropped pending only when a wait for it failed: the peer or the sender is gone.)
class Request {
 public:
  Request() = default;
  // Adopts a UCX request pointer (fabric only); `get_of`: the endpoint of a get, else null.
  explicit Request(void* req, Endpoint* get_of = nullptr) : req_(req), get_of_(get_of) {}
  explicit Request(std::shared_ptr<SoftOp> op);  // a fabric-carried get or flush (fabric only)
  ~Request();
  Request(Request&& other) noexcept : req_(other.req_), get_of_(other.get_of_), op_(std::move(other.op_)) {
    other.req_ = nullptr;
  }
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  bool pending() const { return req_ != nullptr || op_ != nullptr; }
  // Ok when complete, kInProgress while running, an error if it failed. Frees it when done.
  Status check();
  // Progresses `worker` until complete; `alive` is consulted about every millisecond. A read the
  // transport lost never completes while its peer stays alive (a response a Soft-RoCE NIC dropped
  // under load): where the worker has a read timeout, a wait for a read ends with kTransportError
  // after that long (Worker::set_read_timeout).
  Status wait(Worker& worker, const Liveness& alive);

 private:
  void release();
  bool is_read() const;
  Status lost(std::chrono::steady_clock::duration waited) const;  // wait(): a read past the read timeout
  void* req_ = nullptr;
  Endpoint* get_of_ = nullptr;
  std::shared_ptr<SoftOp> op_;
};

class Endpoint {
 public:
  // Connects to a peer worker's address obtained out of band (Worker::address). `peer_host` is
  // the numeric host the control connection reached the peer at: over tcp and rdma the address is
  // the port of the peer worker's connection listener there (cm.h). Over rdma it returns once the
  // NIC has answered a 1-byte read of the peer's memory (a peer it cannot reach is an error within
  // kReachTimeout, never a hang at the first block), and lanes() says what UCX chose.
  // `alive` is consulted while it waits (a control connection that closed ends the wait at once).
  static Status create(Worker& worker, std::span<const uint8_t> remote_address, const std::string& peer_host,
                       std::unique_ptr<Endpoint>* out, const Liveness& alive = {});
  // How long Endpoint::create waits for a connection through a peer's listener, and then for the
  // reachability read (rdma). Generous: a Soft-RoCE VM under emulation takes seconds.
  static constexpr std::chrono::seconds kConnectTimeout{10};
  static constexpr std::chrono::seconds kReachTimeout{10};
  // How often create() connects through a peer's listener when the connection itself fails (its
  // peer still alive), within kConnectTimeout, 50 ms more apart each time: six spread over ~1–3 s
  // (a refusal on a loaded host once lasted past three attempts, 0.7 s).
  static constexpr int kConnectAttempts = 6;
  ~Endpoint();  // force-closes; flush first if data matters
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  enum class State { kOpen, kFailed };
  // kFailed once UCX's error callback reported the peer unreachable (tcp: "Endpoint timeout" when
  // it died); failure() then says why (a kPeerGone or kTransportError Status). Any thread.
  State state() const { return state_.load(std::memory_order_acquire); }
  bool failed() const { return state() == State::kFailed; }
  const Status& failure() const { return failure_; }
  // The lanes UCX chose for this endpoint, one per transport and device with what each carries
  // ("rc_verbs/rxe0:1 rma am keepalive; ..."), from ucp_ep_print_info; empty where not asked
  // (shm, tcp). Set by create().
  const std::string& lanes() const { return lanes_; }
  // Whether UCX puts and gets to the peer in hardware or by the CPU (a lane for RMA: rc, dc,
  // shared memory), not emulated with active messages the peer's worker must answer (ud, or a
  // user's UCX_TLS without an RMA transport). Known where lanes() is; true elsewhere.
  bool rma_one_sided() const { return rma_one_sided_; }
  // Blocks until every operation on this endpoint is remotely complete.
  Status flush(const Liveness& alive);

  // One-sided operations. `*req` receives the pending operation if it did not complete inline;
  // the source buffer of a put must stay untouched until then. Over tcp the fabric carries them
  // itself (soft_rma.h); elsewhere UCX does (shared memory: the CPU copies, no peer involved).
  Status put(const void* src, size_t length, uint64_t remote_addr, RemoteKey& rkey, Request* req);
  Status get(void* dst, size_t length, uint64_t remote_addr, RemoteKey& rkey, Request* req);
  // put(src) then, ordered after it as behind fence(), a put of the `flag_length`-byte word at
  // `flag` (1, 2, 4 or 8 bytes, naturally aligned at `flag_addr`; same key): a peer that sees the
  // flag sees the data — one logical write, the paper's data-then-status-byte pair. `*req` is the
  // data's, as for put(); `flag` must stay valid until the next flush. Over tcp both travel in one
  // active message (one system call instead of two); elsewhere it is put, fence, put.
  Status put_flagged(const void* src, size_t length, uint64_t remote_addr, const void* flag, size_t flag_length,
                     uint64_t flag_addr, RemoteKey& rkey, Request* req);
  // Two-sided active message (used by protocols that notify the receiver). The header must
  // stay valid until the request completes. `want_reply` lets the receiver answer (ReplyEp).
  Status am_send(unsigned id, const void* header, size_t header_len, const void* data, size_t data_len, bool want_reply,
                 Request* req);
  // Two-sided tagged send (UCP tag matching): the message lands in the oldest receive posted on
  // the peer's worker for `tag` (Worker::tag_recv). Posted receives are what a sender must count
  // (credits): with none posted, UCX keeps the message in its unexpected queue (eager) or keeps
  // it at the sender (rendezvous) until one is. `src` must stay untouched until `*req` completes.
  Status tag_send(const void* src, size_t length, uint64_t tag, Request* req);

 private:
  friend class SoftRma;
  friend class RemoteKey;
  friend class Request;
  Endpoint(Worker& worker) : worker_(worker) {}
  static void on_error(void* arg, ucp_ep* ep, int status);
  ucp_ep* handle() const { return handle_; }
  // Reads lanes() and rma_one_sided() from UCX.
  void describe_lanes();
  // The timed 1-byte read of the peer's probe word (create, rdma).
  Status probe(uint64_t address, std::span<const uint8_t> packed_rkey, std::chrono::milliseconds timeout,
               const Liveness& alive);
  // Closes the UCX endpoint (force: every operation on it ends, cancelled) and progresses the
  // worker until that is done and `req` (a get of this endpoint) has ended; failed from then on.
  void abandon(void* req);
  // Closes handle_ and waits (progressing the worker) until UCX is done with it, at most `timeout`.
  void close_handle(std::chrono::milliseconds timeout);
  Worker& worker_;
  // Not a UcxHandle: closing an endpoint progresses its worker until UCX is done with it.
  ucp_ep* handle_ = nullptr;
  std::atomic<State> state_{State::kOpen};
  Status failure_;  // written once, before state_ becomes kFailed
  std::string lanes_;
  bool rma_one_sided_ = true;
};

// The endpoint an active message came from, to answer it (valid while the sender is connected).
struct ReplyEp {
  ucp_ep* ep = nullptr;
  explicit operator bool() const { return ep != nullptr; }
};

// Receives an active message: (header, data, where to reply). Runs on the thread that
// progresses the worker.
using AmHandler =
    std::function<void(std::span<const std::byte> header, std::span<const std::byte> data, ReplyEp reply)>;

// A posted tagged receive into caller-owned memory (Worker::tag_recv). Destroying it while it is
// still posted cancels it; a receive whose data is already being delivered (rendezvous under way)
// cannot be cancelled: call cancel() and keep the memory until check() stops saying kInProgress.
class TagReceive {
 public:
  TagReceive() = default;
  ~TagReceive();
  TagReceive(TagReceive&& other) noexcept;
  TagReceive& operator=(TagReceive&& other) noexcept;
  TagReceive(const TagReceive&) = delete;
  TagReceive& operator=(const TagReceive&) = delete;

  // Posted and not yet seen complete by check().
  bool pending() const { return req_ != nullptr; }
  // Its message was already waiting in UCX when the receive was posted (sent before it).
  bool was_unexpected() const { return unexpected_; }
  // Ok with `*length` = the message's size once it arrived, kInProgress while posted, an error
  // otherwise (kTransportError "...truncated" when the message was longer than the buffer;
  // kCancelled after cancel()). Frees the request once done; pending() is false from then on.
  Status check(size_t* length);
  // Asks UCX to withdraw the receive (completes it as cancelled unless data is already arriving).
  void cancel();

 private:
  friend class Worker;
  void reset();  // cancels and frees a posted receive
  void* req_ = nullptr;
  ucp_worker* worker_ = nullptr;
  bool unexpected_ = false;
};

// A region a peer may reach (MemoryRegion::allocate_exposed) and its packed remote key.
struct ExposedRegion {
  std::unique_ptr<MemoryRegion> region;
  std::vector<uint8_t> rkey;
};

class Worker;

// An active-message handler installed on a worker (Worker::set_am_handler): destroying it
// unhooks the handler (a silent no-op takes its place, so a late message for an owner that is
// gone is dropped, not delivered to freed memory). Declare it after what the handler uses, so it
// goes first. The worker must outlive it. One registration per id and worker: destroying one
// unhooks whatever handler the id has then. Move-only.
class AmRegistration {
 public:
  AmRegistration() = default;
  ~AmRegistration() { reset(); }
  AmRegistration(AmRegistration&& other) noexcept : worker_(std::exchange(other.worker_, nullptr)), id_(other.id_) {}
  AmRegistration& operator=(AmRegistration&& other) noexcept {
    if (this != &other) {
      reset();
      worker_ = std::exchange(other.worker_, nullptr);
      id_ = other.id_;
    }
    return *this;
  }
  AmRegistration(const AmRegistration&) = delete;
  AmRegistration& operator=(const AmRegistration&) = delete;

  bool active() const { return worker_ != nullptr; }
  // Unhooks now (the thread that may install handlers on the worker).
  void reset();

 private:
  friend class Worker;
  Worker* worker_ = nullptr;
  unsigned id_ = 0;
};

class Worker {
 public:
  // shared: several threads call into it (receiver); wakeup: usable with wait_for_event().
  static Status create(Context& ctx, bool shared, bool wakeup, std::unique_ptr<Worker>* out);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  Context& context() const { return ctx_; }
  // What a peer needs to connect to this worker (Endpoint::create): UCX's worker address, or over
  // tcp the port of the worker's connection listener (cm.h). Opaque above the fabric.
  const std::vector<uint8_t>& address() const { return address_; }
  // Whether the fabric carries this worker's puts and gets itself (soft_rma.h): on tcp only.
  bool soft_rma() const { return soft_ != nullptr; }

  unsigned progress();
  // progress() while a peer connects (counted apart: Counters::setup_progress_calls).
  unsigned progress_setup();
  // Orders every put/get issued before it before every one issued after it.
  Status fence();
  // Blocks until the worker has an event, `signal()` is called (also before this call: a signal
  // is kept until the next wait) or `timeout` passes (a worker created with wakeup). Progresses
  // first: returns at once if there was work.
  Status wait_for_event(std::chrono::microseconds timeout = std::chrono::seconds(1));
  // wait_for_event(timeout), or a plain sleep of `timeout` where that fails (a worker without a
  // wake-up fd): a backing-off waiter that an event may end early.
  void wait_or_sleep(std::chrono::microseconds timeout);
  // Any thread.
  void signal();
  // The typical time from Request::wait to completion of operations that were not complete when
  // it started (wait_policy::update_typical; 0 before the first). Any thread.
  std::chrono::nanoseconds typical_completion() const {
    return std::chrono::nanoseconds(typical_completion_ns_.load(std::memory_order_relaxed));
  }
  void note_completion(std::chrono::nanoseconds sample);
  // How long Request::wait waits for a read (a get) of a peer that is alive before it calls the read
  // lost (kTransportError). A read's answer needs nothing of the peer's application (its NIC, or over
  // tcp its progress thread, answers) and waits at most behind the puts issued before it, so one this
  // late was lost on the way. Puts and flushes are not bounded: they go at the link's pace. The owner
  // of the worker decides: a sender gives its stall timeout. Zero (the default): no limit. Set before
  // the worker is used.
  void set_read_timeout(std::chrono::milliseconds limit) { read_timeout_ = limit; }
  std::chrono::milliseconds read_timeout() const { return read_timeout_; }

  // Registers an active-message handler for `id` (one per id per worker: a later one replaces
  // it); `*out` unhooks it when destroyed. UCX runs the handler inside progress() of this worker.
  Status set_am_handler(unsigned id, AmHandler handler, AmRegistration* out);
  // Sends an active message back on a ReplyEp (any thread of a shared worker). The header must
  // stay valid until the request completes.
  Status am_reply(ReplyEp to, unsigned id, const void* header, size_t header_len, Request* req);
  // Posts a receive of up to `length` bytes at `dst` for messages tagged exactly `tag` (any
  // endpoint). Receives for one tag are matched in the order they were posted, as a queue pair
  // consumes its receive queue; their completions need not come in that order (a rendezvous
  // message completes after a later eager one). Any thread of a shared worker.
  Status tag_recv(void* dst, size_t length, uint64_t tag, TagReceive* out);

  // Keeps `buffer` until this worker is gone: the header or source of a send that UCX may still
  // read after its owner gave up waiting for it (a reply stuck towards a peer that left). Freed
  // after the UCX worker, which ends every request it has, so it is neither freed under UCX nor
  // leaked. Any thread.
  template <typename T>
  void keep_until_destroyed(std::unique_ptr<T> buffer) {
    if (buffer) keep(std::shared_ptr<const void>(std::move(buffer)));
  }

 private:
  friend class Endpoint;
  friend class SoftRma;
  friend class AmRegistration;
  Status install_am_handler(unsigned id, AmHandler handler);
  void keep(std::shared_ptr<const void> buffer);
  Worker(Context& ctx, ucp_worker* handle);
  ucp_worker* handle() const { return handle_.get(); }
  Context& ctx_;
  UcxHandle<ucp_worker> handle_;
  std::unique_ptr<SoftRma> soft_;         // puts and gets carried by the fabric (traits: tcp; soft_rma.h)
  std::unique_ptr<CmListener> listener_;  // peers connect through it (traits: tcp, rdma; cm.h)
  std::vector<uint8_t> address_;
  std::unique_ptr<MemoryRegion> probe_;  // rdma: the word peers read to prove reachability (cm.h)
  int event_fd_ = -1;
  std::atomic<int64_t> typical_completion_ns_{0};  // note_completion(); racing updates may lose one
  std::chrono::milliseconds read_timeout_{0};
  // Every handler ever installed, kept until the worker goes: a replaced one may still be running
  // in another thread's progress() of a shared worker while it is replaced.
  std::vector<std::unique_ptr<AmHandler>> am_handlers_;
  std::mutex kept_mutex_;
  std::vector<std::shared_ptr<const void>> kept_;  // keep_until_destroyed(): freed after handle_
};

// Drives a shared worker from its own thread, sleeping in the kernel while there is nothing to
// do (so an idle receiver costs no CPU). Needed wherever RMA needs the target's progress
// (TransportTraits::target_progress: tcp, rdma over ud); rdma over rc/dc and shared memory run
// without it.
class ProgressThread {
 public:
  explicit ProgressThread(Worker& worker);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // A thread that polls the worker itself while data flows (a receiver's consumer between its
  // passes) takes the progress thread's place: while any Driver holds it, the progress thread
  // stands down instead of being woken from the kernel for every message (one thread fewer on
  // the receiving path); it resumes once the last Driver lets go. Each Driver on one thread.
  // Standing down, it looks every kDriverLook whether any Driver polled since its last look, and
  // progresses the worker itself when none did (a consumer busy in its sink, while other
  // sessions' data arrives): no session waits longer than that for another's Driver.
  static constexpr std::chrono::milliseconds kDriverLook{10};
  class Driver {
   public:
    explicit Driver(ProgressThread* thread) : thread_(thread) {}
    ~Driver() { release(); }
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;
    // Progresses the worker (taking over first if not held yet); what Worker::progress returns.
    // With no progress thread (a transport that needs no target progress) nothing: 0.
    unsigned poll();
    // Lets go, before this thread sleeps or does anything slow: the progress thread resumes.
    void release();

   private:
    ProgressThread* thread_;
    bool held_ = false;
  };

  // How many times this thread waited for events (and progressed the worker): tests.
  uint64_t turns() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream::fabric
