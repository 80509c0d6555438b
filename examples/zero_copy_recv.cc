// A zero-copy receiver (issue 22): each message is lent in place (MessageView) and read by another
// thread, which releases it when done; with --mode copy the same consumer gets a copy of each
// message instead (the MessageSink path), for comparison. Verifies synthetic frames
// (`slotstream send --synthetic`): every byte, per-device order. Used by
// tests/integration/test_zero_copy.py and by the zero-copy measurement in docs/benchmarks.md.
//
//   zero_copy_recv [--transport shm|tcp] [--mode view|copy|copy-pool] [--senders N] [--max-held K]
//                  [--window W] [--hold-first-ms MS] [--hold K] [--verify on|off] [--self-send N] [--delay-ms MS]
//
// Prints `listening on HOST:PORT`, serves N senders, then one JSON line. --window W: the consumer
// keeps the W newest views and releases older ones (an application that looks back at frames);
// --hold-first-ms: the first message's view is kept that long while the stream goes on, and its
// bytes are checked unchanged afterwards (the sender must have skipped its block, status 2);
// --hold K: the first K views are kept until the end (the sender works around K held blocks).
// The JSON line includes the process's peak resident memory (VmHWM, rss_hwm_kb).
// --self-send N: no other process — a Sender in this one sends N synthetic frames on each of two
// devices through 8 blocks of 64 KiB, and the exit code says whether every check held (the
// sanitizer builds run it: views released on the consumer thread while UCX writes other blocks).
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "../tools/synthetic.h"
#include "slotstream/slotstream.h"

using namespace slotstream;
using Clock = std::chrono::steady_clock;

namespace {

struct Item {
  MessageView view;             // --mode view
  std::vector<std::byte> copy;  // --mode copy
  uint16_t device = 0;
  std::span<const std::byte> data() const { return view ? view.data() : std::span<const std::byte>(copy); }
};

// Handed from the session thread to the consumer thread.
class Queue {
 public:
  void push(Item item) {
    std::lock_guard lock(mu_);
    items_.push_back(std::move(item));
    cv_.notify_one();
  }
  enum Popped { kItem, kNone, kClosed };
  // The next item, or kNone after `wait` without one (the consumer's timers run meanwhile).
  Popped pop(Item* out, std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return !items_.empty() || closed_; });
    if (items_.empty()) return closed_ ? kClosed : kNone;
    *out = std::move(items_.front());
    items_.pop_front();
    return kItem;
  }
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool closed_ = false;
};

class QueueViews : public ViewSink {
 public:
  explicit QueueViews(Queue& q) : q_(q) {}
  Status take(MessageView& view) override {
    Item item;
    item.device = view.device();
    item.view = std::move(view);
    q_.push(std::move(item));
    return Status::ok();
  }

 private:
  Queue& q_;
};

// Buffers the consumer is done with, for --mode copy-pool.
class Pool {
 public:
  std::vector<std::byte> get() {
    std::lock_guard lock(mu_);
    if (spare_.empty()) return {};
    auto b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }
  void put(std::vector<std::byte> b) {
    std::lock_guard lock(mu_);
    if (spare_.size() < 64) spare_.push_back(std::move(b));
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<std::byte>> spare_;
};

// The copy path: every message copied out of its block once, as a copying application would — into a fresh
// buffer (--mode copy: a new numpy array or bytes object per frame), or into one the consumer gave back
// (--mode copy-pool: the cheapest copying application, no page faults for fresh memory).
class QueueCopies : public MessageSink {
 public:
  QueueCopies(Queue& q, Pool* pool) : q_(q), pool_(pool) {}
  Status begin(uint16_t device) override {
    if (pool_) open_[device] = pool_->get();
    open_[device].clear();
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> d) override {
    open_[device].insert(open_[device].end(), d.begin(), d.end());
    return Status::ok();
  }
  Status commit(uint16_t device) override {
    Item item;
    item.device = device;
    item.copy = std::move(open_[device]);
    q_.push(std::move(item));
    return Status::ok();
  }
  void abort(uint16_t device) override { open_[device].clear(); }

 private:
  Queue& q_;
  Pool* pool_;
  std::map<uint16_t, std::vector<std::byte>> open_;
};

uint64_t word_sum(std::span<const std::byte> d) {
  uint64_t s = 0;
  size_t i = 0;
  for (; i + 8 <= d.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, d.data() + i, 8);
    s += w;
  }
  for (; i < d.size(); ++i) s += uint64_t(d[i]);
  return s;
}

uint64_t fnv(std::span<const std::byte> d) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte b : d) h = (h ^ uint64_t(b)) * 1099511628211ull;
  return h;
}

struct Args {
  Transport transport = Transport::kShm;
  bool copy = false;
  bool pool = false;  // --mode copy-pool
  uint64_t senders = 1;
  uint32_t max_held = 0;
  size_t window = 0;
  int hold_first_ms = 0;
  size_t hold = 0;     // --hold K: the first K views kept to the end
  bool verify = true;  // --verify off: only sum every 8-byte word (a cheap consumer, for measuring)
  uint32_t self_send = 0;
  int delay_ms = 0;  // --delay-ms: the consumer takes this long per message (a slow application)  // --self-send N: a
                     // Sender in this process sends N frames per device, then checks
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--transport" && parse_transport(v)) {
      a->transport = *parse_transport(v);
    } else if (k == "--mode" && (v == "view" || v == "copy" || v == "copy-pool")) {
      a->copy = v != "view";
      a->pool = v == "copy-pool";
    } else if (k == "--senders") {
      a->senders = std::stoull(v);
    } else if (k == "--max-held") {
      a->max_held = uint32_t(std::stoul(v));
    } else if (k == "--window") {
      a->window = std::stoul(v);
    } else if (k == "--delay-ms") {
      a->delay_ms = std::stoi(v);
    } else if (k == "--self-send") {
      a->self_send = uint32_t(std::stoul(v));
    } else if (k == "--verify" && (v == "on" || v == "off")) {
      a->verify = v == "on";
    } else if (k == "--hold") {
      a->hold = std::stoul(v);
    } else if (k == "--hold-first-ms") {
      a->hold_first_ms = std::stoi(v);
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

// What the consumer thread found.
struct Tally {
  uint64_t messages = 0, bytes = 0, bad = 0, out_of_order = 0, copied = 0, in_place = 0, registered = 0;
  uint64_t during_hold = 0;  // messages read while the first view was held
  uint64_t sum = 0;          // --verify off
  bool held_intact = true;
  std::string first_error;
};

// Reads `item` (verifying a synthetic frame, or summing its words) and counts what it found.
void inspect(const Item& item, const Args& args, std::map<uint32_t, uint32_t>& next_frame, Tally* t) {
  if (args.delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(args.delay_ms));
  ++t->messages;
  t->bytes += item.data().size();
  if (item.view) {
    ++(item.view.copied() ? t->copied : t->in_place);
    if (item.view.in_registered_memory()) ++t->registered;
  }
  if (!args.verify) {
    t->sum += word_sum(item.data());
    return;
  }
  std::string why;
  auto id = tools::check_synthetic(item.data(), &why);  // reads every byte
  if (!id) {
    if (t->bad++ == 0) t->first_error = why;
    return;
  }
  auto [it, fresh] = next_frame.try_emplace(id->device, id->frame);
  if (it->second != id->frame) ++t->out_of_order;
  it->second = id->frame + 1;
}

void consume(Queue& q, const Args& args, Tally* t, Pool* pool) {
  std::map<uint32_t, uint32_t> next_frame;
  std::deque<Item> window;
  std::vector<Item> held;  // --hold K
  Item first;              // --hold-first-ms: the first view, kept until first_until
  uint64_t first_sum = 0;
  Clock::time_point first_until{};
  for (;;) {
    Item item;
    const auto popped = q.pop(&item, std::chrono::milliseconds(5));
    if (first.view && Clock::now() >= first_until) {
      t->held_intact = fnv(first.view.data()) == first_sum;
      first = Item{};  // released from this thread: the sender may reuse its block
    }
    if (popped == Queue::kClosed) break;
    if (popped == Queue::kNone) continue;
    inspect(item, args, next_frame, t);
    if (first.view) ++t->during_hold;
    if (args.hold_first_ms > 0 && t->messages == 1 && item.view) {
      first_sum = fnv(item.view.data());
      first_until = Clock::now() + std::chrono::milliseconds(args.hold_first_ms);
      first = std::move(item);
      continue;
    }
    if (held.size() < args.hold && item.view) {
      held.push_back(std::move(item));
      continue;
    }
    window.push_back(std::move(item));
    for (; window.size() > args.window; window.pop_front()) {  // releases the oldest view
      if (args.pool) pool->put(std::move(window.front().copy));
    }
  }
  if (first.view) t->held_intact = fnv(first.view.data()) == first_sum;
}

// The process's peak resident memory (kB), from /proc/self/status.
long rss_hwm_kb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

const char* mode_name(const Args& args) {
  if (args.pool) return "copy-pool";
  return args.copy ? "copy" : "view";
}

void print_summary(const Args& args, const Tally& tally, const SessionReport& last, double cpu) {
  std::printf(
      "{\"mode\":\"%s\",\"messages\":%llu,\"bytes\":%llu,\"bad\":%llu,\"out_of_order\":%llu,\"copied\":%llu,"
      "\"in_place\":%llu,\"registered\":%llu,\"during_hold\":%llu,\"held_intact\":%s,\"cpu_s\":%.3f,"
      "\"seconds\":%.3f,\"views_lent\":%llu,\"view_limit_waits\":%llu,\"stored\":%llu,\"gaps\":%llu,"
      "\"sum\":%llu,\"rss_hwm_kb\":%ld,\"first_error\":\"%s\"}\n",
      mode_name(args), (unsigned long long)tally.messages, (unsigned long long)tally.bytes,
      (unsigned long long)tally.bad, (unsigned long long)tally.out_of_order, (unsigned long long)tally.copied,
      (unsigned long long)tally.in_place, (unsigned long long)tally.registered, (unsigned long long)tally.during_hold,
      tally.held_intact ? "true" : "false", cpu, last.seconds, (unsigned long long)last.views_lent,
      (unsigned long long)last.view_limit_waits, (unsigned long long)last.messages, (unsigned long long)last.gaps,
      (unsigned long long)tally.sum, rss_hwm_kb(), tally.first_error.c_str());
}

// --self-send: `frames` synthetic 30,000-byte frames on devices 0 and 1, through 8 blocks.
Status self_send(const Args& args, const std::string& address, uint32_t frames) {
  SenderOptions so;
  so.host = "127.0.0.1";
  so.port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  so.name = "self";
  so.transport = args.transport;
  so.blocks = 8;
  so.block_size = 65536;
  so.devices = {0, 1};
  std::unique_ptr<Sender> tx;
  SLOTSTREAM_RETURN_IF_ERROR(Sender::connect(so, &tx));
  constexpr uint64_t kFrame = 30000;
  for (uint32_t f = 0; f < frames; ++f) {
    for (uint16_t d : so.devices) {
      SLOTSTREAM_RETURN_IF_ERROR(tx->device(d)->send_with(kFrame, [&](uint64_t offset, std::span<std::byte> dst) {
        tools::fill_synthetic(d, f, kFrame, offset, dst);
        return Status::ok();
      }));
    }
  }
  return tx->finish();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, &args)) {
    std::fprintf(
        stderr,
        "usage: zero_copy_recv [--transport shm|tcp] [--mode view|copy|copy-pool] [--senders N] [--max-held K] "
        "[--window W] [--hold-first-ms MS] [--hold K] [--verify on|off] [--self-send N] [--delay-ms MS]\n");
    return 2;
  }
  Queue queue;
  Pool pool;
  SessionReport last;
  std::mutex report_mu;
  ReceiverOptions ro;
  ro.host = "127.0.0.1";
  ro.transport = args.transport;
  ro.max_held_blocks = args.max_held;
  if (args.copy) {
    ro.make_sink = [&](const SenderInfo&, std::unique_ptr<MessageSink>* s) {
      *s = std::make_unique<QueueCopies>(queue, args.pool ? &pool : nullptr);
      return Status::ok();
    };
  } else {
    ro.make_view_sink = [&](const SenderInfo&, std::unique_ptr<ViewSink>* s) {
      *s = std::make_unique<QueueViews>(queue);
      return Status::ok();
    };
  }
  ro.on_event = [](const std::string& e) { std::fprintf(stderr, "event: %s\n", e.c_str()); };
  ro.on_session_end = [&](const SessionReport& r) {
    std::lock_guard lock(report_mu);
    last.merge(r);
  };
  std::unique_ptr<Receiver> rx;
  if (Status st = Receiver::start(ro, &rx); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  std::printf("listening on %s\n", rx->listen_address().c_str());
  std::fflush(stdout);

  Tally tally;
  const double cpu0 = cpu_seconds();
  std::thread consumer([&] { consume(queue, args, &tally, &pool); });
  std::thread sender;
  Status sent;
  if (args.self_send) sender = std::thread([&] { sent = self_send(args, rx->listen_address(), args.self_send); });
  rx->wait_sessions(args.senders);
  if (sender.joinable()) sender.join();
  queue.close();
  consumer.join();
  const double cpu = cpu_seconds() - cpu0;
  rx->stop();
  std::lock_guard lock(report_mu);
  print_summary(args, tally, last, cpu);
  if (!args.self_send) return 0;
  if (!sent.is_ok()) return std::fprintf(stderr, "self-send: %s\n", sent.to_string().c_str()), 1;
  const bool ok = tally.messages == 2ull * args.self_send && tally.bad == 0 && tally.out_of_order == 0 &&
                  tally.held_intact && (args.copy || tally.registered == tally.in_place);
  std::fprintf(stderr, "zero_copy_recv: self-send %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
