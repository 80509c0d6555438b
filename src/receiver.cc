// The receiver: accepts senders on the control socket, gives each its own block region, and
// runs one consumer thread per sender that polls that region's status bytes (paper §3.2.5) and
// hands complete messages to the sender's sink. The receiver makes no network operation on the
// data path; on transports where UCX emulates RMA in software (tcp), a progress thread serves
// the sender's puts and gets.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "common.h"
#include "fabric/fabric.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "protocol/protocol.h"
#include "slotstream/slotstream.h"
#include "stream/delivery.h"
#include "wire/control.h"

namespace slotstream {

using Clock = std::chrono::steady_clock;
using net::Millis;

namespace {

constexpr Millis kHelloTimeout{5000};
constexpr Millis kStallRetry{100};
// After FIN, how long the receiver waits for blocks it was told about before calling them lost.
constexpr Millis kFinGrace{1000};
// After a sender died, let the progress thread apply what already arrived before the last drain.
constexpr Millis kLostGrace{50};
constexpr uint32_t kMaxDevices = 4096;
// Connections served at once (handshakes included). Each costs a thread; beyond this a new
// connection is refused at once instead of growing the process without bound.
constexpr size_t kMaxConnections = 1024;
constexpr auto kBusyLogInterval = std::chrono::seconds(10);
constexpr auto kSpinIdle = std::chrono::microseconds(200);
constexpr auto kMinIdleSleep = std::chrono::microseconds(20);
constexpr auto kMaxIdleSleep = std::chrono::microseconds(1000);
// A sender idle for 100 ms or more (a camera that stopped, a once-a-second sensor, a quiet night)
// is looked at every 20 ms: hundreds of idle connections then cost ~nothing, and the first message
// after the pause waits at most that long. Streams with shorter gaps (a 25 fps camera: 40 ms) keep
// the ≤ 1 ms naps.
constexpr auto kLongIdle = std::chrono::milliseconds(100);
constexpr auto kLongIdleSleep = std::chrono::milliseconds(20);

// How long a consumer idle for `idle` sleeps before it looks again: an eighth of the idle time,
// at least kMinIdleSleep, at most kMaxIdleSleep (kLongIdleSleep once idle for kLongIdle).
Clock::duration idle_nap(Clock::duration idle) {
  const Clock::duration cap = idle > kLongIdle ? Clock::duration(kLongIdleSleep) : kMaxIdleSleep;
  return std::clamp<Clock::duration>(idle / 8, kMinIdleSleep, cap);
}

struct Refusal {
  Code code;
  std::string message;
};

}  // namespace

// UCX context + shared worker for one wire, created when the first sender asks for it.
struct WireFabric {
  std::unique_ptr<fabric::Context> context;
  std::unique_ptr<fabric::Worker> worker;
  std::unique_ptr<fabric::ProgressThread> progress;
};

struct Receiver::Impl {
  ReceiverOptions options;
  std::unique_ptr<net::Listener> listener;
  std::string my_host_id = host_id();
  std::atomic<bool> stopping{false};
  std::thread accept_thread;

  std::mutex mutex;  // guards everything below
  std::condition_variable ended_cv;
  uint64_t ended = 0;
  // A sender is one group of connections (lanes); its name is taken while any lane is live.
  // Its connections must carry one name and the sender's random group id, each its own lane
  // number and devices no other lane has: two senders that pick the same name or id are never
  // merged into one.
  struct Group {
    std::string name;
    uint64_t wire_group = 0;     // the id the sender chose (HELLO)
    uint16_t lanes = 1;
    std::vector<bool> lane_taken;
    std::set<uint16_t> devices;  // of every lane so far
    uint16_t live = 0;           // registered lanes not yet ended
    uint16_t ended = 0;
    SessionReport report;
  };
  std::map<uint64_t, Group> groups;  // by an id of the receiver's own
  uint64_t next_group = 1;
  // Published by each session (connection) about every 100 ms, with its sender group.
  std::map<const void*, std::pair<uint64_t, SessionReport>> live;
  std::map<fabric::Wire, std::unique_ptr<WireFabric>> wires;
  // One thread per connection. A finished thread puts its id in `finished` and the accept loop
  // joins it: a thread that is never joined keeps its stack mapping, and a receiver that serves
  // reconnecting senders for days would run out of mappings (vm.max_map_count) and abort.
  std::map<uint64_t, std::thread> sessions;
  std::vector<uint64_t> finished;
  uint64_t next_session = 0;
  // Receiver memory (blocks) promised to senders now, against options.max_memory.
  uint64_t memory_in_use = 0;

  void accept_loop();
  void start_session(std::unique_ptr<net::ControlSocket> control);
  void reap_sessions();
  // Reserves `bytes` of the memory budget, or says why not.
  std::optional<std::string> reserve_memory(uint64_t bytes);
  void release_memory(uint64_t bytes);
  void serve(std::unique_ptr<net::ControlSocket> control);
  Status wire_fabric(fabric::Wire wire, WireFabric** out);
  void event(const std::string& text) {
    if (options.on_event) options.on_event(text);
  }
  wire::CapacityInfo capacity();
  // Takes the sender name for this connection's group (nullopt, *group set), or says why not.
  std::optional<std::string> register_lane(const wire::Hello& hello, uint64_t* group);
  // A registered lane ended; reports the sender once all its lanes have.
  void lane_ended(uint64_t group, const SessionReport& report);

  // ReceiverOptions::round_robin: one consumer thread passes over every session in turn. A
  // session's own thread hands it over after the handshake and waits for it to end.
  class RoundRobin;
  std::unique_ptr<RoundRobin> round_robin;
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

  // Runs `step` on the consumer thread until it returns false. Any thread; blocks until then.
  void serve(const Step& step) {
    Entry e{&step};
    std::unique_lock lock(mutex_);
    entries_.push_back(&e);
    changed_.notify_all();
    changed_.wait(lock, [&] { return e.done; });
  }

 private:
  struct Entry {
    const Step* step;
    bool done = false;
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
        if (go) continue;
        std::lock_guard lock(mutex_);
        entries_.erase(std::find(entries_.begin(), entries_.end(), e));
        e->done = true;  // its thread may destroy it as soon as the lock is released
        changed_.notify_all();
      }
      const auto now = Clock::now();
      if (any) {
        last_work = now;
      } else if (!options_.busy_poll && now - last_work > kSpinIdle) {
        std::this_thread::sleep_for(idle_nap(now - last_work));
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

wire::CapacityInfo Receiver::Impl::capacity() {
  wire::CapacityInfo c;
  {
    std::lock_guard lock(mutex);
    c.senders = static_cast<uint32_t>(live.size());
  }
  if (options.backlog_bytes) c.backlog_bytes = options.backlog_bytes();
  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c.load_milli = static_cast<uint32_t>(load1 * 1000 / (cpus > 0 ? cpus : 1));
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) c.shm_free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  return c;
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
  g.lane_taken[hello.lane] = true;
  g.devices.insert(hello.devices.begin(), hello.devices.end());
  ++g.live;
  *group = it->first;
  return std::nullopt;
}

std::optional<std::string> Receiver::Impl::reserve_memory(uint64_t bytes) {
  std::lock_guard lock(mutex);
  const uint64_t budget = options.max_memory;
  if (bytes <= budget && memory_in_use <= budget - bytes) {
    memory_in_use += bytes;
    return std::nullopt;
  }
  return "not enough receiver memory: this connection asks for " + format_bytes(bytes) + ", " +
         format_bytes(memory_in_use) + " of the receiver's " + format_bytes(budget) +
         " budget are in use (recv --max-memory; fewer or smaller blocks on the sender)";
}

void Receiver::Impl::release_memory(uint64_t bytes) {
  std::lock_guard lock(mutex);
  memory_in_use -= bytes;
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
  groups.erase(group);
  lock.unlock();
  if (options.on_session_end) options.on_session_end(done);
  lock.lock();
  ++ended;
  ended_cv.notify_all();
}

// ------------------------------------------------------------------------------ one session

namespace {

class Session {
 public:
  Session(Receiver::Impl& rx, std::unique_ptr<net::ControlSocket> control)
      : rx_(rx), control_(std::move(control)) {
    report_.sender.peer = control_->peer();
  }

  void run();

 private:
  // Returns a refusal to send, or nullopt when accepted. In order: read_hello, check_hello,
  // authenticate, set_up (allocates and sends ACCEPT), connect (SETUP -> READY).
  std::optional<Refusal> handshake();
  std::optional<Refusal> read_hello(wire::Hello* hello);
  std::optional<Refusal> check_hello(const wire::Hello& hello);
  std::optional<Refusal> authenticate(const wire::Hello& hello);
  std::optional<Refusal> set_up(const wire::Hello& hello);
  std::optional<Refusal> connect();
  // The consumer loop: begin_consume(), then step() until it returns false (the session ended:
  // FIN answered, sender lost, or receiver stopping). One pass per step, so that one thread can
  // serve several sessions in turn (ReceiverOptions::round_robin); consume() is the thread per
  // sender with its idle policy.
  void consume();
  void begin_consume();
  bool step();
  bool worked() const { return loop_.worked; }
  // The UCX worker this session's protocol uses: its own, or the transport's shared one.
  fabric::Worker& worker() { return own_worker_ ? *own_worker_ : *wire_->worker; }
  void apply_holds(Clock::time_point start);
  void hold_all(bool held);
  void fill_report(Clock::time_point start);
  void publish(Clock::time_point start);

  Receiver::Impl& rx_;
  std::unique_ptr<net::ControlSocket> control_;
  const protocol::Descriptor* desc_ = nullptr;
  protocol::Options options_;
  Transport transport_ = Transport::kShm;
  WireFabric* wire_ = nullptr;
  std::vector<uint8_t> hello_bytes_;      // as received: the authentication proofs cover them
  std::optional<net::Nonce> my_nonce_;    // set when the sender was challenged (token)
  net::Nonce sender_nonce_{};
  // Declared in the order they must be created; destroyed in reverse (protocol, then the
  // endpoint back to the sender, then the session's own worker).
  std::unique_ptr<fabric::Worker> own_worker_;    // Descriptor::receiver_progress
  std::unique_ptr<fabric::Endpoint> to_sender_;   // Descriptor::receiver_endpoint
  std::unique_ptr<protocol::ReceiverProtocol> proto_;
  std::unique_ptr<MessageSink> sink_;
  std::unique_ptr<stream::Delivery> delivery_;
  protocol::Geometry geometry_;
  SessionReport report_;
  bool registered_ = false;  // counted in its sender group (must report when it ends)
  bool held_all_ = false;
  bool capacity_only_ = false;  // the connection only asked for capacity
  uint64_t group_ = 0;
  uint64_t reserved_bytes_ = 0;  // of the receiver's memory budget, released when the session ends
  std::map<uint16_t, Clock::time_point> next_pause_log_;
  std::vector<bool> hold_active_;
  struct Loop {  // the consumer loop's state between passes
    Clock::time_point start, last_work, next_busy_log, next_publish, next_check, fin_deadline, retry_at, lost_at;
    std::optional<wire::Fin> fin;
    bool stalled = false;
    bool logged_stall = false;
    bool worked = false;  // the last pass consumed something or the protocol progressed
    std::string last_error;
    std::string lost;  // why the sender is gone (set: drain after lost_at, then end)
  } loop_;
};

std::optional<Refusal> Session::handshake() {
  wire::Hello hello;
  if (auto r = read_hello(&hello)) return r;
  if (capacity_only_) return std::nullopt;
  if (auto r = check_hello(hello)) return r;
  if (auto r = authenticate(hello)) return r;
  if (auto r = set_up(hello)) return r;
  return connect();
}

std::optional<Refusal> Session::read_hello(wire::Hello* hello) {
  wire::Frame frame;
  if (Status st = control_->receive(kHelloTimeout, &frame); !st.is_ok()) {
    return Refusal{st.code(), "no valid hello: " + st.message()};
  }
  if (frame.type == wire::MsgType::kCapacityRequest) {
    if (Status st = wire::decode_capacity_request(frame.body); !st.is_ok()) return Refusal{st.code(), st.message()};
    capacity_only_ = true;
    (void)control_->send(wire::MsgType::kCapacity, wire::encode(rx_.capacity()));
    return std::nullopt;
  }
  if (frame.type != wire::MsgType::kHello) {
    return Refusal{Code::kProtocolError, "expected hello, got message type " + std::to_string(int(frame.type))};
  }
  if (Status st = wire::decode(frame.body, hello); !st.is_ok()) return Refusal{st.code(), st.message()};
  hello_bytes_ = std::move(frame.body);
  sender_nonce_ = hello->nonce;
  return std::nullopt;
}

// Everything about a hello that can be judged without the token: nothing is allocated yet.
std::optional<Refusal> Session::check_hello(const wire::Hello& hello) {
  desc_ = protocol::find(hello.protocol);
  if (!desc_) return Refusal{Code::kRefused, "unknown protocol '" + hello.protocol + "'"};
  if (Status st = protocol::Options::parse(hello.options, &options_); !st.is_ok()) {
    return Refusal{Code::kRefused, st.message()};
  }
  if (Status st = protocol::check_options(*desc_, options_); !st.is_ok()) return Refusal{Code::kRefused, st.message()};
  if (hello.block_size < kMinBlockSize || hello.block_size > kMaxBlockSize || hello.blocks < 1 ||
      hello.blocks > kMaxBlocks) {
    return Refusal{Code::kRefused, "unsupported block geometry " + std::to_string(hello.blocks) + " x " +
                                       std::to_string(hello.block_size) + " B"};
  }
  if (auto why = invalid_sender_name(hello.name)) return Refusal{Code::kRefused, "invalid sender name: " + *why};
  if (hello.devices.empty() || hello.devices.size() > kMaxDevices) {
    return Refusal{Code::kRefused, "a sender must declare 1.." + std::to_string(kMaxDevices) + " devices"};
  }

  // Transport: what the sender asked for, within what this receiver allows.
  const Transport allowed = rx_.options.transport;
  const bool same_host = hello.host_id == rx_.my_host_id;
  switch (hello.transport) {
    case wire::WireTransport::kShm: transport_ = Transport::kShm; break;
    case wire::WireTransport::kTcp: transport_ = Transport::kTcp; break;
    default: transport_ = allowed != Transport::kAuto ? allowed : (same_host ? Transport::kShm : Transport::kTcp);
  }
  if (allowed != Transport::kAuto && transport_ != allowed) {
    return Refusal{Code::kRefused, std::string("this receiver only accepts transport ") + transport_name(allowed)};
  }
  if (transport_ == Transport::kShm && !same_host) {
    return Refusal{Code::kRefused, "transport shm needs sender and receiver on one host; use tcp"};
  }
  return std::nullopt;
}

// With a token: the sender proves it over our nonce and every byte of its hello (net/auth.h).
std::optional<Refusal> Session::authenticate(const wire::Hello& hello) {
  report_.sender.name = hello.name;
  if (rx_.options.token.empty()) return std::nullopt;
  net::Nonce nonce;
  if (Status st = net::make_nonce(&nonce); !st.is_ok()) return Refusal{st.code(), st.message()};
  if (Status st = control_->send(wire::MsgType::kChallenge, nonce); !st.is_ok()) return Refusal{st.code(), st.message()};
  std::vector<uint8_t> mac;
  if (Status st = control_->expect(wire::MsgType::kAuth, kHelloTimeout, &mac); !st.is_ok()) {
    return Refusal{Code::kAuthFailed, "authentication failed: " + st.message()};
  }
  if (!net::mac_equal(mac, net::proof(rx_.options.token, "sender-hello", {nonce, sender_nonce_, hello_bytes_}))) {
    return Refusal{Code::kAuthFailed, "authentication failed: wrong token (or the hello was altered on the way)"};
  }
  my_nonce_ = nonce;
  return std::nullopt;
}

std::optional<Refusal> Session::set_up(const wire::Hello& hello) {
  if (auto why = rx_.register_lane(hello, &group_)) return Refusal{Code::kRefused, *why};
  registered_ = true;

  SenderInfo& info = report_.sender;
  info.name = hello.name;
  info.protocol = hello.protocol;
  info.transport = transport_;
  info.blocks = hello.blocks;
  info.block_size = hello.block_size;
  info.devices = hello.devices;
  geometry_ = {hello.blocks, hello.block_size};

  // Nothing is allocated for a sender before it is authenticated and fits the memory budget.
  const uint64_t region = geometry_.bytes() + geometry_.blocks;
  if (auto why = rx_.reserve_memory(region)) return Refusal{Code::kRefused, *why};
  reserved_bytes_ = region;

  if (Status st = rx_.wire_fabric(to_wire(transport_), &wire_); !st.is_ok()) {
    return Refusal{st.code(), "receiver transport set-up failed: " + st.message()};
  }
  // A protocol whose receiver takes part in transfers (notifications, ACKs) gets a worker of its
  // own that only this session's thread progresses — as an RDMA receiver polls its own
  // completion queue — instead of contending with every other session for the shared one.
  if (desc_->receiver_progress) {
    if (Status st = fabric::Worker::create(*wire_->context, /*shared=*/false, /*wakeup=*/true, &own_worker_);
        !st.is_ok()) {
      return Refusal{st.code(), "receiver transport set-up failed: " + st.message()};
    }
  }
  protocol::ReceiverFabric rf{*wire_->context, worker(), geometry_};
  if (Status st = desc_->make_receiver(rf, options_, &proto_); !st.is_ok()) {
    return Refusal{st.code(), "cannot set up " + format_bytes(geometry_.bytes()) + " of blocks: " + st.message()};
  }
  if (Status st = rx_.options.make_sink(info, &sink_); !st.is_ok()) {
    return Refusal{st.code(), "cannot store this sender's data: " + st.message()};
  }
  delivery_ = std::make_unique<stream::Delivery>(*proto_, *sink_, hello.devices);
  delivery_->set_pause_handler([this](uint16_t device, bool paused) {
    // Tell the sender to stop (or resume) filling this one device; the others keep flowing.
    (void)control_->send(wire::MsgType::kPause, wire::encode(wire::Pause{device, paused}));
    if (!paused) return;
    ++report_.stalls;
    // A slow worker pauses its device again and again: say so at most every kBusyLogInterval
    // per device (the metrics count every pause).
    if (auto& next = next_pause_log_[device]; Clock::now() >= next) {
      next = Clock::now() + kBusyLogInterval;
      rx_.event("sender " + report_.sender.name + ": device " + std::to_string(device) +
                " paused while its worker catches up (the other devices keep flowing)");
    }
  });

  wire::Accept accept;
  accept.transport = transport_ == Transport::kTcp ? wire::WireTransport::kTcp : wire::WireTransport::kShm;
  accept.worker_address = worker().address();
  accept.setup = proto_->setup();
  if (my_nonce_) {
    auto mac = net::proof(rx_.options.token, "receiver-accept",
                          {*my_nonce_, sender_nonce_, hello_bytes_, wire::signed_part(accept)});
    accept.proof.assign(mac.begin(), mac.end());
  }
  if (Status st = control_->send(wire::MsgType::kAccept, wire::encode(accept)); !st.is_ok()) {
    return Refusal{st.code(), st.message()};
  }
  return std::nullopt;
}

// The sender's half of the set-up (SETUP), then READY.
std::optional<Refusal> Session::connect() {
  std::vector<uint8_t> body;
  if (Status st = control_->expect(wire::MsgType::kSetup, kHelloTimeout, &body); !st.is_ok()) {
    return Refusal{st.code(), "no set-up from the sender: " + st.message()};
  }
  wire::Setup setup;
  if (Status st = wire::decode(body, &setup); !st.is_ok()) return Refusal{st.code(), st.message()};
  if (my_nonce_) {
    auto mac = net::proof(rx_.options.token, "sender-setup", {*my_nonce_, sender_nonce_, wire::signed_part(setup)});
    if (!net::mac_equal(setup.proof, mac)) {
      return Refusal{Code::kAuthFailed, "authentication failed: the sender's set-up is not signed with the token"};
    }
  }
  if (desc_->receiver_endpoint) {
    if (Status st = fabric::Endpoint::create(worker(), setup.worker_address, &to_sender_); !st.is_ok()) {
      return Refusal{st.code(), "cannot reach the sender's memory: " + st.message()};
    }
  }
  if (Status st = proto_->connect({to_sender_.get(), setup.setup}); !st.is_ok()) {
    return Refusal{st.code(), "sender set-up rejected: " + st.message()};
  }
  if (Status st = control_->send(wire::MsgType::kReady, {}); !st.is_ok()) return Refusal{st.code(), st.message()};
  return std::nullopt;
}

void Session::hold_all(bool held) {
  // Without per-block holds the records simply stay unreleased while the sink refuses them.
  if (desc_->holds) {
    for (uint32_t i = 0; i < geometry_.blocks; ++i) {
      if (!hold_active_[i]) proto_->set_hold(i, held);
    }
  }
  held_all_ = held;
}

void Session::fill_report(Clock::time_point start) {
  const auto& c = delivery_->counters();
  report_.messages = c.messages;
  report_.bytes = c.bytes;
  report_.gaps = c.gaps;
  report_.duplicates = c.duplicates;
  report_.unknown_device = c.unknown_device;
  report_.out_of_window = c.out_of_window;
  report_.bad_headers = c.bad_headers;
  if (c.buffer_observed_ns > 0) {
    report_.buffer_held_avg = c.buffer_held_byte_ns / c.buffer_observed_ns;
    report_.buffer_useful_avg = c.buffer_useful_byte_ns / c.buffer_observed_ns;
  }
  report_.partial_discarded = c.partial_discarded + c.broken_messages;
  report_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report_.held_blocks = held_all_ ? geometry_.blocks
                                  : uint64_t(std::count(hold_active_.begin(), hold_active_.end(), true));
  report_.per_device = delivery_->per_device();
  report_.protocol_counters = proto_->stats().counters;
}

void Session::publish(Clock::time_point start) {
  fill_report(start);
  std::lock_guard lock(rx_.mutex);
  rx_.live[this] = {group_, report_};
}

void Session::apply_holds(Clock::time_point start) {
  auto ms = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
  for (const HoldSpec& h : rx_.options.holds) {
    if (h.index >= geometry_.blocks) continue;
    bool want = ms >= h.from_ms && ms < h.to_ms;
    if (want != hold_active_[h.index]) {
      hold_active_[h.index] = want;
      // A protocol without per-block status (sliding window) cannot mark the block
      // unavailable; the closest the receiver can do is keep it unprocessed for that time.
      if (desc_->holds) {
        proto_->set_hold(h.index, want);
      } else {
        delivery_->set_blocked(h.index, want);
      }
    }
  }
}

void Session::begin_consume() {
  loop_ = Loop{};
  loop_.start = loop_.last_work = loop_.next_busy_log = loop_.next_publish = loop_.next_check = Clock::now();
  hold_active_.assign(geometry_.blocks, false);
}

// Thread per sender: passes until the session ends, idle in between (paper §3.2.5: "sleeps for a
// fixed time before querying again"). While data flows the receiver keeps polling (a sleeping
// receiver stalls a sender whose blocks are all full); once idle for kSpinIdle it sleeps, longer
// the longer it has been idle (idle_nap) — so an idle receiver costs ~no CPU and a burst is picked
// up within ~1 ms (20 ms after a long pause).
void Session::consume() {
  begin_consume();
  while (step()) {
    if (rx_.options.busy_poll) continue;
    const auto now = Clock::now();
    if (loop_.stalled && now < loop_.retry_at) {
      std::this_thread::sleep_until(loop_.retry_at);
    } else if (now - loop_.last_work > kSpinIdle) {
      proto_->wait(std::chrono::duration_cast<std::chrono::microseconds>(idle_nap(now - loop_.last_work)));
    } else if (!loop_.worked) {
      std::this_thread::yield();  // let the sender (maybe on this core) fill the next block
    }
  }
}

bool Session::step() {
  Loop& l = loop_;
  if (rx_.stopping.load(std::memory_order_acquire)) {
    delivery_->abort_partials();
    report_.reason = "receiver stopped";
    return false;
  }
  if (!l.lost.empty()) {
    if (Clock::now() < l.lost_at) return true;
    // The sender is gone. Records already complete hold whole data: keep them (the sink may
    // still fail), then discard what is partial.
    size_t consumed = 1;
    while (consumed > 0) {
      if (!delivery_->pass(&consumed).is_ok()) break;
    }
    delivery_->abort_partials();
    report_.reason = l.lost;
    return false;
  }
  // After a sender died, let the progress thread apply what already arrived before the last drain.
  auto finish_lost = [&](const std::string& why) {
    l.lost = why;
    l.lost_at = Clock::now() + kLostGrace;
    return true;
  };
  if (!rx_.options.holds.empty()) apply_holds(l.start);

  const bool progressed = proto_->progress();
  size_t consumed = 0;
  if (!l.stalled || Clock::now() >= l.retry_at) {
    Status st = delivery_->pass(&consumed);
    if (!st.is_ok()) {
      // Stop accepting: the data stays in its block, the empty ones are marked held (paper
      // status 2), and the sender waits until the sink works again; retried every kStallRetry.
      // Log each new reason once. Worker back-pressure comes and goes with every message a
      // slow worker finishes: log it at most every kBusyLogInterval (the metrics count stalls).
      const bool busy = st.code() == Code::kBusy;
      const bool news = !l.stalled ? !busy || Clock::now() >= l.next_busy_log : st.message() != l.last_error && !busy;
      if (news) {
        rx_.event("sender " + report_.sender.name + ": holding blocks until this clears: " + st.to_string());
        if (busy) l.next_busy_log = Clock::now() + kBusyLogInterval;
        l.logged_stall = true;
      }
      if (!l.stalled) {
        hold_all(true);
        ++report_.stalls;
      }
      l.stalled = true;
      l.last_error = st.message();
      l.retry_at = Clock::now() + kStallRetry;
    } else if (l.stalled) {
      l.stalled = false;
      hold_all(false);
      if (l.logged_stall) rx_.event("sender " + report_.sender.name + ": storing again");
      l.logged_stall = false;
    }
  }

  if (l.fin) {
    // A reference protocol (ucx_raw_put) delivers nothing by design: the flushed FIN is all.
    bool complete = desc_->reference || !delivery_->has_open_message();
    for (auto [d, n] : l.fin->messages) complete = complete && (desc_->reference || delivery_->messages(d) >= n);
    if (complete || (consumed == 0 && !l.stalled && !delivery_->any_paused() && Clock::now() > l.fin_deadline)) {
      uint64_t missing = 0;
      for (auto [d, n] : l.fin->messages) {
        uint64_t got = delivery_->messages(d);
        if (got < n && !desc_->reference) missing += n - got;
      }
      delivery_->abort_partials();
      wire::FinAck ack;
      ack.ok = missing == 0;
      ack.stored = delivery_->counters().messages;
      ack.message = missing == 0 ? "all stored" : std::to_string(missing) + " messages did not arrive";
      (void)control_->send(wire::MsgType::kFinAck, wire::encode(ack));
      report_.finished = missing == 0;
      if (missing) report_.reason = ack.message;
      return false;
    }
    if (consumed > 0 || l.stalled || delivery_->any_paused()) l.fin_deadline = Clock::now() + kFinGrace;
  }

  const auto now = Clock::now();
  l.worked = consumed > 0 || progressed;
  if (l.worked) l.last_work = now;
  if (now >= l.next_check) {
    l.next_check = now + Millis(1);
    if (now >= l.next_publish) {
      l.next_publish = now + Millis(100);
      publish(l.start);
    }
    Status alive = control_->check_alive();
    if (alive.code() == Code::kPeerGone) return finish_lost("connection closed mid-stream");
    if (alive.code() == Code::kInProgress && !l.fin) {
      std::vector<uint8_t> body;
      wire::Fin f;
      Status rs = control_->expect(wire::MsgType::kFin, Millis(1000), &body);
      if (rs.is_ok()) rs = wire::decode(body, &f);
      if (!rs.is_ok()) return finish_lost("bad control message: " + rs.message());
      l.fin = std::move(f);
      l.fin_deadline = Clock::now() + kFinGrace;
    }
  }
  return true;
}

void Session::run() {
  const auto start = Clock::now();
  if (auto refusal = handshake()) {
    std::string who = report_.sender.name.empty() ? report_.sender.peer : report_.sender.name + " (" + report_.sender.peer + ")";
    rx_.event("refused sender " + who + ": " + refusal->message);
    wire::Refuse r{refusal->code, refusal->message};
    (void)control_->send(wire::MsgType::kRefuse, wire::encode(r));
    control_->drain_and_close(Millis(200));
    delivery_.reset();
    sink_.reset();
    proto_.reset();
    to_sender_.reset();
    own_worker_.reset();
    if (reserved_bytes_) rx_.release_memory(reserved_bytes_);
    if (registered_) {
      report_.reason = "refused: " + refusal->message;
      rx_.lane_ended(group_, report_);
    }
    return;
  }
  if (capacity_only_) return;
  if (rx_.round_robin) {
    begin_consume();
    rx_.round_robin->serve([this](bool* worked) {
      const bool go = step();
      *worked = loop_.worked;
      return go;
    });
  } else {
    consume();
  }
  fill_report(start);
  {
    std::lock_guard lock(rx_.mutex);
    rx_.live.erase(this);
  }
  // Free this sender's region before anyone hears that it has ended.
  delivery_.reset();
  sink_.reset();
  proto_.reset();
  to_sender_.reset();
  own_worker_.reset();
  control_.reset();
  rx_.release_memory(reserved_bytes_);
  rx_.lane_ended(group_, report_);
}

}  // namespace

// --------------------------------------------------------------------------------- receiver

Status Receiver::Impl::wire_fabric(fabric::Wire wire, WireFabric** out) {
  std::lock_guard lock(mutex);
  auto& wf = wires[wire];
  if (!wf) {
    auto fresh = std::make_unique<WireFabric>();
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(wire, &fresh->context));
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(*fresh->context, /*shared=*/true, /*wakeup=*/true, &fresh->worker));
    wf = std::move(fresh);
  }
  // Software-emulated RMA (tcp) needs the target to progress. (Protocols whose receiver takes
  // part in transfers progress a worker of their own session.)
  if (!wf->progress && wire == fabric::Wire::kTcp) {
    wf->progress = std::make_unique<fabric::ProgressThread>(*wf->worker);
  }
  *out = wf.get();
  return Status::ok();
}

void Receiver::Impl::serve(std::unique_ptr<net::ControlSocket> control) {
  Session session(*this, std::move(control));
  session.run();
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

void Receiver::Impl::start_session(std::unique_ptr<net::ControlSocket> control) {
  std::string refused;
  {
    std::lock_guard lock(mutex);
    if (sessions.size() < kMaxConnections) {
      const uint64_t id = next_session++;
      try {
        sessions.emplace(id, std::thread([this, id, c = std::move(control)]() mutable {
          serve(std::move(c));
          std::lock_guard done(mutex);
          finished.push_back(id);
        }));
        return;
      } catch (const std::system_error& e) {
        // Out of threads or memory: this connection is closed (the lambda owned it); every
        // stream already being served goes on.
        refused = std::string("cannot start a thread for a new connection (") + e.what() + "); closed it";
      }
    } else {
      refused = "refused a connection: " + std::to_string(kMaxConnections) + " connections are being served";
    }
  }
  if (control) {
    wire::Refuse r{Code::kBusy, "receiver busy: too many connections, try again later"};
    (void)control->send(wire::MsgType::kRefuse, wire::encode(r));
  }
  event(refused);
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

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Receiver::~Receiver() { stop(); }

Status Receiver::start(ReceiverOptions options, std::unique_ptr<Receiver>* out) {
  if (!options.make_sink) return {Code::kInvalidArgument, "ReceiverOptions::make_sink is required"};
  if (options.max_memory == 0) options.max_memory = default_max_memory();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  SLOTSTREAM_RETURN_IF_ERROR(net::Listener::open(impl->options.host, impl->options.port, &impl->listener));
  // Bring up the transports we allow now, so a UCX problem shows at start, not at first sender.
  for (fabric::Wire w : {fabric::Wire::kShm, fabric::Wire::kTcp}) {
    Transport t = w == fabric::Wire::kShm ? Transport::kShm : Transport::kTcp;
    if (impl->options.transport != Transport::kAuto && impl->options.transport != t) continue;
    WireFabric* wf = nullptr;
    SLOTSTREAM_RETURN_IF_ERROR(impl->wire_fabric(w, &wf));
  }
  if (impl->options.round_robin) impl->round_robin = std::make_unique<Impl::RoundRobin>(impl->options);
  std::unique_ptr<Receiver> rx(new Receiver(std::move(impl)));
  Impl* im = rx->impl_.get();
  im->accept_thread = std::thread([im] { im->accept_loop(); });
  *out = std::move(rx);
  return Status::ok();
}

std::string Receiver::listen_address() const { return impl_->listener->address(); }

void Receiver::stop() {
  Impl& im = *impl_;
  if (im.stopping.exchange(true)) {
    if (im.accept_thread.joinable()) im.accept_thread.join();
    return;
  }
  if (im.accept_thread.joinable()) im.accept_thread.join();
  std::map<uint64_t, std::thread> sessions;
  {
    std::lock_guard lock(im.mutex);
    sessions.swap(im.sessions);
    im.finished.clear();
    im.ended_cv.notify_all();
  }
  for (auto& [id, t] : sessions) t.join();
  im.round_robin.reset();  // every session it served has ended
  std::lock_guard lock(im.mutex);
  im.wires.clear();  // progress threads stop, workers and contexts are destroyed
}

std::vector<SessionReport> Receiver::live_sessions() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<SessionReport> out;
  std::map<uint64_t, SessionReport> senders;  // by group: one report per sender
  for (const auto& [session, live] : impl_->live) {
    auto [it, fresh] = senders.try_emplace(live.first, live.second);
    if (!fresh) it->second.merge(live.second);
  }
  for (auto& [group, r] : senders) out.push_back(std::move(r));
  return out;
}

size_t Receiver::live_count() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->live.size();  // connections
}

Status query_capacity(const std::string& host, uint16_t port, Capacity* out) {
  std::unique_ptr<net::ControlSocket> control;
  SLOTSTREAM_RETURN_IF_ERROR(net::ControlSocket::connect(host, port, Millis(2000), &control));
  SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kCapacityRequest, wire::encode_capacity_request()));
  std::vector<uint8_t> body;
  SLOTSTREAM_RETURN_IF_ERROR(control->expect(wire::MsgType::kCapacity, Millis(2000), &body));
  wire::CapacityInfo c;
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(body, &c));
  *out = {c.senders, c.backlog_bytes, c.load_milli / 1000.0, c.shm_free_bytes};
  return Status::ok();
}

uint64_t Receiver::sessions_ended() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->ended;
}

void Receiver::wait_sessions(uint64_t n) {
  std::unique_lock lock(impl_->mutex);
  impl_->ended_cv.wait(lock, [&] { return impl_->ended >= n || impl_->stopping.load(); });
}

}  // namespace slotstream
