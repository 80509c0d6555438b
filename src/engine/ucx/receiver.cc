// UCX's receiver engine (receiver.h): it accepts senders on the control socket, gives each its own
// block region, and runs one consumer thread per sender that polls that region's status bytes (paper
// §3.2.5) and hands complete messages to the sender's sink. The receiver makes no network operation
// on the data path; where RMA is not one-sided in hardware (tcp, rdma over ud) a progress thread
// serves the sender's puts and gets (rdma over rc and dc needs none). Each connection is a session
// (src/engine/ucx/session/receiver_session.h: handshake and consumer loop); this file holds what
// sessions share: the accept loop, sender groups (lanes), the memory budget, the transports' fabrics.
// The round-robin consumer is in receiver.h.
#include "engine/ucx/receiver.h"

#include <sys/ioctl.h>

#include "engine/hello_rules.h"

namespace slotstream {

wire::CapacityInfo Receiver::Impl::capacity() {
  uint32_t senders;
  {
    std::lock_guard lock(mutex);
    senders = static_cast<uint32_t>(live.size());
  }
  return session::host_capacity(senders, options.backlog_bytes ? options.backlog_bytes() : 0);
}

std::optional<std::string> Receiver::Impl::register_lane(const wire::Hello& hello, uint64_t* group) {
  std::lock_guard lock(mutex);
  auto it = std::find_if(groups.begin(), groups.end(),
                         [&](const auto& kv) { return kv.second.name == hello.name && kv.second.live > 0; });
  if (it != groups.end() && it->second.wire_group != hello.group) {
    return "sender name '" + hello.name + "' is already connected";
  }
  if (it == groups.end()) {
    Group fresh;
    fresh.name = hello.name;
    fresh.wire_group = hello.group;
    fresh.lanes = hello.lanes;
    fresh.lane_taken.assign(hello.lanes, false);
    it = groups.emplace(next_group++, std::move(fresh)).first;
  }
  Group& g = it->second;
  if (g.lanes != hello.lanes) return "connection does not match its sender group (lane count)";
  if (g.lane_taken[hello.lane]) {
    return "lane " + std::to_string(hello.lane) + " of sender '" + hello.name + "' is already connected";
  }
  for (uint16_t d : hello.devices) {
    if (g.devices.contains(d)) return "device " + std::to_string(d) + " is already sent on another connection";
  }
  // One connection declares at most wire::kMaxDevices; a sender of many lanes no more in all (each
  // device costs delivery state and, once it carries data, metric series).
  if (g.devices.size() + hello.devices.size() > wire::kMaxDevices) {
    return "sender '" + hello.name + "' would have more than " + std::to_string(wire::kMaxDevices) +
           " devices: a sender may declare at most that many over all its connections";
  }
  g.lane_taken[hello.lane] = true;
  g.devices.insert(hello.devices.begin(), hello.devices.end());
  ++g.live;
  *group = it->first;
  return std::nullopt;
}

std::optional<std::string> Receiver::Impl::reserve_memory(uint64_t bytes) {
  std::lock_guard lock(mutex);
  if (auto why = engine::check_budget(bytes, memory_used, options.max_memory)) return why;
  memory_used += bytes;
  return std::nullopt;
}

void Receiver::Impl::release_memory(uint64_t bytes) {
  std::lock_guard lock(mutex);
  memory_used -= bytes;
}

void Receiver::Impl::lane_ended(uint64_t group, const SessionReport& r) {
  std::unique_lock lock(mutex);
  Group& g = groups[group];
  --g.live;
  if (g.ended == 0) {
    g.report = r;
  } else {
    g.report.merge(r);
  }
  // Report once every lane has ended — or once none is live any more (a sender that died while
  // connecting its lanes never opens the rest).
  if (++g.ended < g.lanes && g.live > 0) return;
  SessionReport done = std::move(g.report);
  const bool accepted = g.accepted;
  groups.erase(group);
  if (!accepted) return;  // refused after registering: logged as refused, no ended session
  lock.unlock();
  if (options.on_session_end) options.on_session_end(done);
  lock.lock();
  ++ended;
  ended_cv.notify_all();
}

// --------------------------------------------------------------------------------- receiver

Status Receiver::Impl::transport_fabric(Transport transport, TransportFabric** out) {
  std::lock_guard lock(mutex);
  auto& wf = fabrics[transport];
  if (!wf) {
    auto fresh = std::make_unique<TransportFabric>();
    std::unique_ptr<fabric::Context> context;
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(spec(transport), &context));
    fresh->context = std::move(context);
    SLOTSTREAM_RETURN_IF_ERROR(
        fabric::Worker::create(*fresh->context, /*shared=*/true, /*wakeup=*/true, &fresh->worker));
    wf = std::move(fresh);
  }
  // RMA that is not one-sided in hardware (tcp: the fabric's own; rdma over ud: UCX's emulation
  // and software reliability) needs the target to progress. (Protocols whose receiver takes part
  // in transfers progress a worker of their own session.)
  if (!wf->progress && wf->context->traits().target_progress) {
    wf->progress = std::make_unique<fabric::ProgressThread>(*wf->worker);
  }
  *out = wf.get();
  return Status::ok();
}

// A connection's own thread: the handshake, then the consumer loop here or on the round-robin
// thread, then the session's end.
void Receiver::Impl::serve(uint64_t id, std::unique_ptr<net::ControlSocket> control) {
  session::ReceiverSession s(*this, id, std::move(control));
  if (!s.open()) return;
  const RoundRobin::Step step = [&s](bool* worked) {
    const bool go = s.step();
    *worked = s.worked();
    return go;
  };
  if (round_robin) {
    s.begin_consume();
    round_robin->serve(step);
  } else {
    s.consume([this, &step] { return idle_loop->serve(step, /*until_work=*/true); });
  }
  s.close();
}

void Receiver::Impl::accept_loop() {
  while (!stopping.load(std::memory_order_acquire)) {
    reap_sessions();
    std::unique_ptr<net::ControlSocket> control;
    if (Status st = listener->accept(Millis(100), &control); !st.is_ok()) {
      event("accept failed: " + st.to_string());
      std::this_thread::sleep_for(Millis(100));
      continue;
    }
    if (control) start_session(std::move(control));
  }
}

// A new connection: it starts unauthenticated (engine/ucx/session/admission.h), possibly closing another
// unauthenticated one for room, and gets a thread of its own.
void Receiver::Impl::start_session(std::unique_ptr<net::ControlSocket> control) {
  const std::string source = control->peer_host();
  std::string refused;
  {
    std::unique_lock lock(mutex);
    wait_for_evicted_threads(lock);
    if (sessions.size() - finished.size() < kMaxSessionThreads) {
      const uint64_t id = next_session++;
      if (auto victim = admission.arrive(id, source, [this](uint64_t v) { return has_unread_bytes(v); })) {
        evict(*victim);
      }
      unauthenticated_fds[id] = ::dup(control->fd());
      try {
        sessions.emplace(id, std::thread([this, id, c = std::move(control)]() mutable {
                           serve(id, std::move(c));
                           connection_ended(id);
                         }));
        return;
      } catch (const std::system_error& e) {
        // Out of threads or memory: this connection is closed (the lambda owned it); every
        // stream already being served goes on.
        admission.ended(id);
        forget_unauthenticated_fd(id);
        refused = std::string("cannot start a thread for a new connection (") + e.what() + "); closed it";
      }
    } else {
      refused = "refused a connection: " + std::to_string(sessions.size()) + " connections are being served";
    }
  }
  if (control) {
    wire::Refuse r{Code::kBusy, "receiver busy: too many connections, try again later"};
    (void)control->send(wire::MsgType::kRefuse, wire::encode(r));
  }
  count_refusal({"busy", nullptr});
  event(refused);
}

// At the thread cap because connections closed for room have not ended yet (a flood: each
// arrival evicts one, and their threads wait for a core): the accept loop waits for them, while
// new connections queue in the kernel, rather than refuse a sender for their sake.
void Receiver::Impl::wait_for_evicted_threads(std::unique_lock<std::mutex>& lock) {
  thread_done_cv.wait_for(lock, kEvictedWait, [this] {
    return sessions.size() - finished.size() < kMaxSessionThreads || evicted.empty() ||
           stopping.load(std::memory_order_acquire);
  });
}

// Closes an unauthenticated connection for room: its session's handshake read fails and it ends.
void Receiver::Impl::evict(uint64_t id) {
  if (auto it = unauthenticated_fds.find(id); it != unauthenticated_fds.end() && it->second >= 0) {
    ::shutdown(it->second, SHUT_RDWR);
  }
  forget_unauthenticated_fd(id);
  evicted.insert(id);
  ++evictions;
  const auto now = Clock::now();
  if (now < next_eviction_log) return;
  next_eviction_log = now + kEvictionLogInterval;
  event("closed " + std::to_string(evictions) + " unauthenticated connection(s) to make room for new ones (at most " +
        std::to_string(session::kMaxUnauthenticated) +
        " handshakes at once, the address with the most losing its oldest; senders that authenticate are not "
        "affected)");
  evictions = 0;
}

// Whether an unauthenticated connection has bytes its thread has not read yet: a sender's HELLO
// that arrived while its thread waited for a core (the flood it competes with never sends any).
bool Receiver::Impl::has_unread_bytes(uint64_t id) const {
  const auto it = unauthenticated_fds.find(id);
  int unread = 0;
  return it != unauthenticated_fds.end() && it->second >= 0 && ::ioctl(it->second, FIONREAD, &unread) == 0 &&
         unread > 0;
}

void Receiver::Impl::forget_unauthenticated_fd(uint64_t id) {
  if (auto it = unauthenticated_fds.find(id); it != unauthenticated_fds.end()) {
    if (it->second >= 0) ::close(it->second);
    unauthenticated_fds.erase(it);
  }
}

// A connection's thread is done: it leaves the budgets and will be joined.
void Receiver::Impl::connection_ended(uint64_t id) {
  std::lock_guard lock(mutex);
  admission.ended(id);
  forget_unauthenticated_fd(id);
  evicted.erase(id);
  finished.push_back(id);
  thread_done_cv.notify_all();
}

void Receiver::Impl::reap_sessions() {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mutex);
    for (uint64_t id : finished) {
      auto it = sessions.find(id);
      done.push_back(std::move(it->second));
      sessions.erase(it);
    }
    finished.clear();
  }
  for (auto& t : done) t.join();  // each has returned from serve() already
}

// What this receiver offers: rdma when a usable device is there (its absence is an error only when
// rdma is the one transport allowed: nothing could ever connect).
Status Receiver::Impl::decide_terms() {
  terms.allowed = options.transport;
  terms.rdma = options.rdma.transport.value_or(RdmaTransport::kRc);
  terms.facts = {host_id(), shm_domain(), options.transport == Transport::kAuto || options.transport == Transport::kShm,
                 false};
  if (options.transport != Transport::kAuto && options.transport != Transport::kRdma) return Status::ok();
  const fabric::RdmaReport& rdma = fabric::host_rdma(spec(Transport::kRdma));
  if (!rdma.usable && options.transport == Transport::kRdma) {
    return {Code::kInvalidArgument, "transport rdma: " + rdma.why + "; use --transport tcp (or auto)"};
  }
  terms.facts.rdma = rdma.usable;
  return Status::ok();
}

// Brings up the transports we allow now, so a UCX problem shows at start, not at the first sender.
// Under auto, an rdma that fails to come up is not offered (and said so).
Status Receiver::Impl::bring_up() {
  for (Transport t : {Transport::kShm, Transport::kTcp, Transport::kRdma}) {
    if (options.transport != Transport::kAuto && options.transport != t) continue;
    if (t == Transport::kRdma && !terms.facts.rdma) continue;
    TransportFabric* tf = nullptr;
    Status st = transport_fabric(t, &tf);
    if (!st.is_ok() && t == Transport::kRdma && options.transport == Transport::kAuto) {
      event("rdma not offered: " + st.message());
      terms.facts.rdma = false;
      continue;
    }
    SLOTSTREAM_RETURN_IF_ERROR(st);
    for (const std::string& line : tf->context->ucx_overrides()) event(std::string(transport_name(t)) + ": " + line);
  }
  return Status::ok();
}

void Receiver::Impl::stop(const std::string& reason) {
  Impl& im = *this;
  {
    std::lock_guard lock(im.mutex);
    if (!im.stopping.load(std::memory_order_acquire)) im.stopped_because = reason;
  }
  if (im.stopping.exchange(true)) {
    if (im.accept_thread.joinable()) im.accept_thread.join();
    return;
  }
  {
    std::lock_guard lock(im.mutex);
    im.thread_done_cv.notify_all();  // an accept loop waiting for evicted threads stops waiting
  }
  if (im.accept_thread.joinable()) im.accept_thread.join();
  std::map<uint64_t, std::thread> sessions;
  {
    std::lock_guard lock(im.mutex);
    // Handshakes in progress end now rather than after their deadline.
    for (const auto& [id, fd] : im.unauthenticated_fds) ::shutdown(fd, SHUT_RDWR);
    sessions.swap(im.sessions);
    im.finished.clear();
    im.ended_cv.notify_all();
  }
  for (auto& [id, t] : sessions) t.join();
  im.round_robin.reset();  // every session it served has ended
  im.idle_loop.reset();
  std::lock_guard lock(im.mutex);
  im.fabrics.clear();  // progress threads stop, workers and contexts are destroyed
}

std::vector<SessionReport> Receiver::Impl::live_sessions() const {
  std::lock_guard lock(mutex);
  std::vector<SessionReport> out;
  std::map<uint64_t, SessionReport> senders;  // by group: one report per sender
  for (const auto& [session, l] : live) {
    auto [it, fresh] = senders.try_emplace(l.first, l.second);
    if (!fresh) it->second.merge(l.second);
  }
  for (auto& [group, r] : senders) out.push_back(std::move(r));
  return out;
}

uint64_t Receiver::Impl::memory_in_use() const {
  std::lock_guard lock(mutex);
  return memory_used;
}

uint64_t Receiver::Impl::sessions_ended() const {
  std::lock_guard lock(mutex);
  return ended;
}

RefusalCounts Receiver::Impl::refusals() const {
  std::lock_guard lock(mutex);
  return refused;
}

void Receiver::Impl::wait_sessions(uint64_t n) {
  std::unique_lock lock(mutex);
  ended_cv.wait(lock, [&] { return ended >= n || stopping.load(); });
}

// Listens, brings up the transports it allows and starts the accept loop.
Status Receiver::Impl::start(ReceiverOptions options, std::unique_ptr<engine::ReceiverEngine>* out) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  SLOTSTREAM_RETURN_IF_ERROR(impl->decide_terms());
  SLOTSTREAM_RETURN_IF_ERROR(net::Listener::open(impl->options.host, impl->options.port, &impl->listener));
  SLOTSTREAM_RETURN_IF_ERROR(impl->bring_up());
  if (impl->options.round_robin) {
    impl->round_robin = std::make_unique<Impl::RoundRobin>(impl->options);
  } else {
    impl->idle_loop = std::make_unique<Impl::RoundRobin>(impl->options);
  }
  Impl* im = impl.get();
  im->accept_thread = std::thread([im] { im->accept_loop(); });
  *out = std::move(impl);
  return Status::ok();
}

}  // namespace slotstream
