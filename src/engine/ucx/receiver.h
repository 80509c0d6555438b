// UCX's receiver engine (Receiver::Impl: the accept loop, sender groups, the memory budget, the transports'
// fabrics; receiver.cc) and its round-robin consumer (Receiver::Impl::RoundRobin). `Receiver`
// (src/receiver.cc) starts it through Impl::start and runs it through engine::ReceiverEngine.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "engine/contract.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/session/admission.h"
#include "engine/ucx/session/capacity.h"
#include "engine/ucx/session/receiver_session.h"
#include "net/control_socket.h"
#include "slotstream/options.h"
#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream {

using net::Millis;
using session::Clock;
using session::TransportFabric;

namespace {

// Threads for connections at once: the authenticated and unauthenticated budgets
// (engine/ucx/session/admission.h), and room for evicted connections whose threads are still ending. Beyond
// this a new connection is closed at once instead of growing the process without bound.
constexpr size_t kMaxSessionThreads = session::kMaxAuthenticated + 2 * session::kMaxUnauthenticated;
// At the cap with evicted connections still ending, the accept loop waits this long for them
// before it refuses a newcomer (busy).
constexpr auto kEvictedWait = std::chrono::seconds(2);
// Evictions are logged together, at most this often (a flood would otherwise flood stderr too).
constexpr auto kEvictionLogInterval = std::chrono::seconds(10);

}  // namespace

struct Receiver::Impl final : session::SessionHost, engine::ReceiverEngine {
  // Listens on options' address, brings up the transports they allow, starts the accept loop.
  static Status start(ReceiverOptions options, std::unique_ptr<engine::ReceiverEngine>* out);

  ReceiverOptions options;
  std::unique_ptr<net::Listener> listener;
  session::ReceiverTerms terms;  // set by start(), before the first connection
  std::atomic<bool> stopping{false};
  std::thread accept_thread;

  mutable std::mutex mutex;     // guards everything below
  std::string stopped_because;  // Receiver::stop(reason): told to every sender
  std::condition_variable ended_cv;
  uint64_t ended = 0;
  // A sender is one group of connections (lanes); its name is taken while any lane is live.
  // Its connections must carry one name and the sender's random group id, each its own lane
  // number and devices no other lane has: two senders that pick the same name or id are never
  // merged into one.
  struct Group {
    std::string name;
    uint64_t wire_group = 0;  // the id the sender chose (HELLO)
    uint16_t lanes = 1;
    std::vector<bool> lane_taken;
    std::set<uint16_t> devices;  // of every lane so far
    uint16_t live = 0;           // registered lanes not yet ended
    uint16_t ended = 0;
    bool accepted = false;  // a lane completed its handshake: the sender is reported when it ends
    SessionReport report;
  };
  std::map<uint64_t, Group> groups;  // by an id of the receiver's own
  uint64_t next_group = 1;
  // Published by each session (connection) about every 100 ms, with its sender group.
  std::map<const void*, std::pair<uint64_t, SessionReport>> live;
  std::map<Transport, std::unique_ptr<TransportFabric>> fabrics;
  // One thread per connection. A finished thread puts its id in `finished` and the accept loop
  // joins it: a thread that is never joined keeps its stack mapping, and a receiver that serves
  // reconnecting senders for days would run out of mappings (vm.max_map_count) and abort.
  std::map<uint64_t, std::thread> sessions;
  std::vector<uint64_t> finished;
  std::condition_variable thread_done_cv;  // a connection's thread put itself in `finished`, or stop()
  uint64_t next_session = 0;
  // Unauthenticated and authenticated connections (engine/ucx/session/admission.h), by session id. To close an
  // unauthenticated one for room, its socket is shut down through a duplicate of its descriptor
  // (the session's own descriptor may be closed meanwhile; the duplicate keeps the socket).
  session::Admission admission;
  std::map<uint64_t, int> unauthenticated_fds;
  std::set<uint64_t> evicted;  // closed for room: they end without a log line each
  uint64_t evictions = 0;      // since the last log line
  Clock::time_point next_eviction_log{};
  // Receiver memory (blocks) promised to senders now, against options.max_memory.
  uint64_t memory_used = 0;
  RefusalCounts refused;  // refusals()

  void accept_loop();
  void start_session(std::unique_ptr<net::ControlSocket> control);
  void wait_for_evicted_threads(std::unique_lock<std::mutex>& lock);
  void evict(uint64_t id);                      // with mutex held
  void forget_unauthenticated_fd(uint64_t id);  // with mutex held
  bool has_unread_bytes(uint64_t id) const;     // with mutex held
  void connection_ended(uint64_t id);
  void reap_sessions();
  void serve(uint64_t id, std::unique_ptr<net::ControlSocket> control);

  // session::SessionHost: what each session uses of the receiver (receiver_session.h).
  const ReceiverOptions& receiver_options() const override { return options; }
  const session::ReceiverTerms& receiver_terms() const override { return terms; }
  uint8_t receiver_offers() const override {
    return (terms.facts.shm ? wire::kOfferShm : 0) | (terms.facts.rdma ? wire::kOfferRdma : 0);
  }
  fabric::FabricSpec spec(Transport t) const {
    return {t, terms.rdma, t == Transport::kRdma ? options.rdma.device : ""};
  }
  Status decide_terms();
  Status bring_up();
  bool is_stopping() const override { return stopping.load(std::memory_order_acquire); }
  std::string stop_reason() const override {
    std::lock_guard lock(mutex);
    return stopped_because;
  }
  wire::CapacityInfo capacity() override;
  void spoke(uint64_t connection) override {
    std::lock_guard lock(mutex);
    admission.spoke(connection);
  }
  std::optional<std::string> authenticated(uint64_t connection) override {
    std::lock_guard lock(mutex);
    forget_unauthenticated_fd(connection);
    return admission.authenticate(connection);
  }
  bool evicted_for_room(uint64_t connection) override {
    std::lock_guard lock(mutex);
    return evicted.contains(connection);
  }
  std::optional<std::string> register_lane(const wire::Hello& hello, uint64_t* group) override;
  void lane_accepted(uint64_t group) override {
    std::lock_guard lock(mutex);
    groups[group].accepted = true;
  }
  void lane_ended(uint64_t group, const SessionReport& report) override;
  std::optional<std::string> reserve_memory(uint64_t bytes) override;
  void release_memory(uint64_t bytes) override;
  Status transport_fabric(Transport transport, TransportFabric** out) override;
  void publish(const void* session, uint64_t group, const SessionReport& report) override {
    std::lock_guard lock(mutex);
    live[session] = {group, report};
  }
  void withdraw(const void* session) override {
    std::lock_guard lock(mutex);
    live.erase(session);
  }
  void event(const std::string& text) override {
    if (options.on_event) options.on_event(text);
  }
  void warning(const std::string& text) override {
    if (!options.on_warning) return event(text);
    options.on_warning(text);
  }
  void count_refusal(const session::RefusalLabels& labels) override {
    std::lock_guard lock(mutex);
    ++refused.refused[labels.refused];
    if (labels.auth_failure) ++refused.authentication_failures[labels.auth_failure];
  }

  // One consumer thread that passes over sessions in turn: every session after its handshake with
  // ReceiverOptions::round_robin (its own thread waits for it to end), and otherwise the sessions
  // whose own thread has parked while they are idle (ReceiverSession::consume): one thread that
  // looks at 1,000 idle senders every 20 ms instead of 1,000 threads that each wake every 20 ms.
  class RoundRobin;
  std::unique_ptr<RoundRobin> round_robin;
  std::unique_ptr<RoundRobin> idle_loop;

  // engine::ReceiverEngine
  ~Impl() override { stop(""); }
  std::string listen_address() const override { return listener->address(); }
  void stop(const std::string& reason) override;
  uint64_t sessions_ended() const override;
  std::vector<SessionReport> live_sessions() const override;
  void wait_sessions(uint64_t n) override;
  RefusalCounts refusals() const override;
  bool accepting() const override { return !stopping.load(std::memory_order_acquire) && accept_thread.joinable(); }
  uint64_t memory_in_use() const override;
  uint64_t memory_budget() const override { return options.max_memory; }
  std::map<std::string, uint64_t> counters() const override { return {}; }  // refusals() has UCX's
  bool settled() const override { return true; }
};

class Receiver::Impl::RoundRobin {
 public:
  // One pass of a session's consumer loop: false once it ended; *worked: it did something.
  using Step = std::function<bool(bool* worked)>;

  explicit RoundRobin(const ReceiverOptions& options) : options_(options), thread_([this] { run(); }) {}
  ~RoundRobin() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Runs `step` on the consumer thread until it returns false — or, with `until_work`, until a
  // pass did something. Any thread; blocks until then. Returns whether the session goes on.
  bool serve(const Step& step, bool until_work = false) {
    Entry e{&step, until_work};
    std::unique_lock lock(mutex_);
    entries_.push_back(&e);
    changed_.notify_all();
    changed_.wait(lock, [&] { return e.done; });
    return e.goes_on;
  }

 private:
  struct Entry {
    const Step* step;
    bool until_work = false;
    bool done = false;
    bool goes_on = false;  // handed back because it worked (until_work), not because it ended
  };

  // The same idle policy as a session's own thread, over all sessions: a nap only when a whole
  // round found nothing to do.
  void run() {
    std::vector<Entry*> turn;
    auto last_work = Clock::now();
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || !entries_.empty(); });
        if (entries_.empty()) return;  // stopping, and every session has ended
        turn = entries_;
      }
      bool any = false;
      for (Entry* e : turn) {
        bool worked = false;
        const bool go = (*e->step)(&worked);
        any = any || worked;
        if (go && !(worked && e->until_work)) continue;
        std::lock_guard lock(mutex_);
        entries_.erase(std::find(entries_.begin(), entries_.end(), e));
        e->goes_on = go;
        e->done = true;  // its thread may destroy it as soon as the lock is released
        changed_.notify_all();
      }
      const auto now = Clock::now();
      if (any) {
        last_work = now;
      } else if (!options_.busy_poll && now - last_work > session::kSpinIdle) {
        std::this_thread::sleep_for(session::idle_nap(now - last_work));
      } else if (!options_.busy_poll) {
        std::this_thread::yield();
      }
    }
  }

  const ReceiverOptions& options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Entry*> entries_;
  bool stop_ = false;
  std::thread thread_;  // last: starts when everything above exists
};

}  // namespace slotstream
