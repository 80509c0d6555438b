#include "engine/ucx/protocol/carc.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/ucx/protocol/posted_receives.h"
#include "slotstream/slotstream.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCacheDir = "/sys/devices/system/cpu/cpu0/cache";
// When sysfs has no cache information (some containers): a per-core L2 of current server CPUs.
constexpr uint64_t kFallbackBudget = 2u << 20;

// Set-up bytes.
//   receiver -> sender (ACCEPT): u64 tag of this session's messages | u64 budget in bytes
//   sender -> receiver (SETUP):  u64 address of the processed word | blob32 its packed rkey
struct ReceiverSetup {
  uint64_t tag = 0;
  uint64_t budget = 0;
};

std::string text_size(uint64_t bytes) {
  if (bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

class CarcSender final : public SenderProtocol {
 public:
  CarcSender(SenderFabric& fabric, ReceiverSetup rs, std::unique_ptr<fabric::MemoryRegion> word,
             std::vector<uint8_t> rkey)
      : fabric_(fabric),
        tag_(rs.tag),
        budget_(rs.budget, fabric.geometry.blocks),
        word_(std::move(word)),
        rkey_(std::move(rkey)) {}

  ~CarcSender() override {
    // After a clean finish the receiver has nothing left to report and puts no more. Otherwise a
    // put may still be on its way, and on tcp our worker's progress (the endpoint's close still
    // progresses it) writes it wherever the word was: keep the word mapped until the context goes.
    if (!finished_) fabric_.context.park(std::move(word_));
  }

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(word_->remote_address());
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    refresh();
    if (!budget_.fits(length)) {
      // Slides: "clients consume credits before send data" — wait until the receiver has
      // processed enough. Which limit held it: the cache budget, or the N posted buffers.
      ++stats_.counters[budget_.bytes_fit(length) ? "buffer_waits" : "budget_waits"];
      WaitTimer wait(stats_);
      SLOTSTREAM_RETURN_IF_ERROR(wait_st([&] { return budget_.fits(length); }));
    }
    budget_.debit(length);
    auto& most = stats_.counters["max_unprocessed_bytes"];
    most = std::max(most, budget_.outstanding_bytes());
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.tag_send(src, length, tag_, data_req));
    ++stats_.records;
    return Status::ok();
  }

  Status finish_st() override {
    // Everything processed: the receiver then has no reason to put again, so the word can go.
    SLOTSTREAM_RETURN_IF_ERROR(wait_st([&] { return budget_.outstanding_records() == 0; }));
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.flush(fabric_.alive));
    finished_ = true;
    return Status::ok();
  }

  // sync_ops: replenishments seen (the word advanced). counters: budget_bytes, buffers,
  // max_unprocessed_bytes (debited, not yet processed: never above budget_bytes), budget_waits,
  // buffer_waits, replenishments, torn_reads (a read that caught a put half-way; ignored).
  ProtocolStats stats() const override {
    ProtocolStats s = stats_;
    s.counters["budget_bytes"] = budget_.budget();
    s.counters["buffers"] = fabric_.geometry.blocks;
    s.counters["replenishments"] = stats_.sync_ops;
    return s;
  }

 private:
  // Reads the receiver's processed counters from our own memory (no network operation).
  void refresh() {
    std::array<std::byte, kProcessedWordSize> copy;
    auto* words = reinterpret_cast<uint64_t*>(word_->data());
    for (size_t k = 0; k < kProcessedWordSize / 8; ++k) {
      const uint64_t v = std::atomic_ref<uint64_t>(words[k]).load(std::memory_order_acquire);
      std::memcpy(copy.data() + 8 * k, &v, 8);
    }
    uint64_t records = 0, bytes = 0;
    if (!decode_processed(copy, &records, &bytes)) {
      ++stats_.counters["torn_reads"];
      return;
    }
    if (budget_.replenish(bytes, records)) ++stats_.sync_ops;
  }

  template <typename Pred>
  Status wait_st(Pred done) {
    for (PollBackoff backoff; (refresh(), !done()); backoff.pause()) {
      // On tcp the receiver's put is emulated and lands only when we progress our worker.
      if (fabric_.worker.progress() != 0) backoff.reset();
      SLOTSTREAM_RETURN_IF_ERROR(fabric_.alive());
      if (fabric_.endpoint.failed()) return {Code::kPeerGone, "receiver unreachable"};
    }
    return Status::ok();
  }

  SenderFabric& fabric_;
  uint64_t tag_;
  ByteBudget budget_;
  std::unique_ptr<fabric::MemoryRegion> word_;
  std::vector<uint8_t> rkey_;  // packed, for the receiver
  bool finished_ = false;
  ProtocolStats stats_;
};

class CarcReceiver final : public ReceiverProtocol {
 public:
  CarcReceiver(ReceiverFabric& fabric, uint64_t budget, std::unique_ptr<PostedReceives> receives)
      : worker_(fabric.worker),
        geometry_(fabric.geometry),
        budget_(budget),
        receives_(std::move(receives)),
        source_(new std::array<std::byte, kProcessedWordSize>{}) {}

  ~CarcReceiver() override {
    // The put's source must outlive it: give the last one a moment, then leave the 24 bytes to
    // the worker rather than free them under UCX (the sender is gone).
    const auto deadline = Clock::now() + std::chrono::milliseconds(50);
    while (put_.pending() && put_.check().code() == Code::kInProgress && Clock::now() < deadline) {
      worker_.progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (put_.pending()) worker_.keep_until_destroyed(std::move(source_));
  }

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(receives_->tag());
    w.u64(budget_);
    return std::move(w.buffer());
  }

  Status connect(const PeerSetup& peer) override {
    if (peer.endpoint == nullptr) return {Code::kProtocolError, "carc needs an endpoint to the sender"};
    wire::Reader r(peer.setup);
    word_addr_ = r.u64();
    std::vector<uint8_t> packed = r.blob32(peer.setup.size());
    if (!r.ok() || !r.at_end() || packed.empty())
      return {Code::kProtocolError, "malformed carc set-up from the sender"};
    SLOTSTREAM_RETURN_IF_ERROR(fabric::RemoteKey::unpack(*peer.endpoint, packed, &rkey_));
    to_sender_ = peer.endpoint;
    return Status::ok();
  }

  bool progress() override {
    const bool any = worker_.progress() != 0;
    if (dirty_) publish();
    return any;
  }

  void poll(std::vector<Record>* out) override { receives_->poll(out); }

  void release(uint64_t id) override {
    std::optional<uint32_t> length = receives_->release(id);
    if (!length) return;
    // The record has been processed (the sink consumed it): only now may its bytes count again.
    ++processed_records_;
    processed_bytes_ += *length;
    dirty_ = true;
    publish();
  }

  uint64_t max_records() const override { return geometry_.blocks; }

  // sync_ops: counter puts. counters: budget_bytes, counter_puts, put_failures, and the receive
  // side's (PostedReceives::counters; max_unreleased_bytes = received and not yet processed: what
  // CARC bounds by the budget).
  ProtocolStats stats() const override {
    ProtocolStats s;
    s.sync_ops = puts_;
    s.counters = receives_->counters();
    s.counters["budget_bytes"] = budget_;
    s.counters["counter_puts"] = puts_;
    s.counters["put_failures"] = put_failures_;
    return s;
  }

 private:
  // Puts the processed counters into the sender's word. One put at a time, always the latest
  // values: a put still under way is never overwritten at its source (it could be sent torn) —
  // the values that came meanwhile go out with the next put (progress() or the next release).
  void publish() {
    if (to_sender_ == nullptr || rkey_ == nullptr) return;
    if (put_.pending() && put_.check().code() == Code::kInProgress) return;
    encode_processed(processed_records_, processed_bytes_, *source_);
    // Puts are not ordered among themselves without a fence: an older count must never land
    // after a newer one (the sender would take it for the final word and wait forever).
    Status st = worker_.fence();
    if (st.is_ok()) st = to_sender_->put(source_->data(), kProcessedWordSize, word_addr_, *rkey_, &put_);
    if (!st.is_ok()) {
      ++put_failures_;  // retried at the next pass (progress()), the values are cumulative
      return;
    }
    dirty_ = false;
    ++puts_;
    if (put_.pending()) worker_.signal();  // the progress thread may be asleep in the kernel
  }

  fabric::Worker& worker_;
  Geometry geometry_;
  uint64_t budget_;
  std::unique_ptr<PostedReceives> receives_;
  std::unique_ptr<std::array<std::byte, kProcessedWordSize>> source_;  // the put's source
  fabric::Endpoint* to_sender_ = nullptr;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  uint64_t word_addr_ = 0;
  fabric::Request put_;
  bool dirty_ = false;  // counters changed since the last put
  uint64_t processed_records_ = 0;
  uint64_t processed_bytes_ = 0;
  uint64_t puts_ = 0;
  uint64_t put_failures_ = 0;
};

Status check_options(const Options& options) {
  SLOTSTREAM_RETURN_IF_ERROR(options.check_known("carc", {"budget"}));
  uint64_t budget = 0;
  SLOTSTREAM_RETURN_IF_ERROR(options.size("budget", 1, &budget));
  if (budget == 0) return {Code::kInvalidArgument, "protocol options: carc budget must be more than 0 bytes"};
  return Status::ok();
}

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options&,
                   std::unique_ptr<SenderProtocol>* out) {
  wire::Reader r(setup);
  ReceiverSetup rs;
  rs.tag = r.u64();
  rs.budget = r.u64();
  if (!r.ok() || !r.at_end()) return {Code::kProtocolError, "malformed carc set-up from receiver"};
  if (rs.budget < fabric.geometry.block_size) {
    return {Code::kProtocolError, "carc budget from the receiver is smaller than one block"};
  }
  // The word the receiver puts its counters into: UCX-allocated, so that on shared memory the
  // put lands without this process's help (docs/design.md).
  fabric::ExposedRegion word;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate_exposed(fabric.context, 64, &word));
  out->reset(new CarcSender(fabric, rs, std::move(word.region), std::move(word.rkey)));
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options& options, std::unique_ptr<ReceiverProtocol>* out) {
  const uint32_t block = fabric.geometry.block_size;
  uint64_t budget = 0;
  if (options.has("budget")) {
    SLOTSTREAM_RETURN_IF_ERROR(options.size("budget", 0, &budget));
    if (budget < block) {
      // A refusal, like any other geometry the receiver does not take (the sender exits 1).
      return {Code::kRefused, "carc budget " + text_size(budget) + " is smaller than one block (" + text_size(block) +
                                  "): a record could never be sent; use a larger "
                                  "budget or a smaller --block-size"};
    }
  } else {
    // Slides: the server sizes the credits to its cache. One block is the least that works.
    std::string how;
    budget = cache_share_bytes(kCacheDir, &how);
    if (budget == 0) {
      budget = kFallbackBudget;
      spdlog::debug("carc: no cache information in {}; budget {}", kCacheDir, text_size(budget));
    }
    budget = std::max<uint64_t>(budget, block);
  }
  std::unique_ptr<PostedReceives> receives;
  SLOTSTREAM_RETURN_IF_ERROR(PostedReceives::create(fabric, next_receive_tag(), &receives));
  out->reset(new CarcReceiver(fabric, budget, std::move(receives)));
  return Status::ok();
}

// "0-1", "0,2-3", "5" -> how many CPUs.
uint64_t count_cpus(const std::string& list) {
  uint64_t n = 0;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? list.size() : comma + 1;
    if (item.empty()) continue;
    try {
      size_t dash = item.find('-');
      uint64_t lo = std::stoull(item.substr(0, dash));
      uint64_t hi = dash == std::string::npos ? lo : std::stoull(item.substr(dash + 1));
      if (hi >= lo) n += hi - lo + 1;
    } catch (const std::exception&) {
      return 0;
    }
  }
  return n;
}

std::string read_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

bool ByteBudget::replenish(uint64_t processed_bytes, uint64_t processed_records) {
  // Modular: an older value is "ahead" by almost 2^64 and fails like an impossible one.
  const uint64_t bytes = processed_bytes - processed_bytes_;
  const uint64_t records = processed_records - processed_records_;
  if (records == 0 || records > outstanding_records() || bytes > outstanding_bytes()) return false;
  processed_bytes_ = processed_bytes;
  processed_records_ = processed_records;
  return true;
}

void encode_processed(uint64_t records, uint64_t bytes, std::span<std::byte, kProcessedWordSize> out) {
  wire::Writer w;
  w.u64(records);
  w.u64(bytes);
  w.u64(records);
  std::memcpy(out.data(), w.buffer().data(), kProcessedWordSize);
}

bool decode_processed(std::span<const std::byte, kProcessedWordSize> in, uint64_t* records, uint64_t* bytes) {
  wire::Reader r({reinterpret_cast<const uint8_t*>(in.data()), in.size()});
  const uint64_t first = r.u64();
  const uint64_t b = r.u64();
  const uint64_t again = r.u64();
  if (first != again) return false;
  *records = first;
  *bytes = b;
  return true;
}

uint64_t cache_share_bytes(const std::string& cache_dir, std::string* how) {
  namespace fs = std::filesystem;
  std::error_code ec;
  uint64_t best_level = 0, best_size = 0, best_cpus = 0;
  for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
    if (entry.path().filename().string().rfind("index", 0) != 0) continue;
    const std::string type = read_line(entry.path() / "type");
    if (type != "Data" && type != "Unified") continue;  // not instruction caches
    uint64_t level = 0;
    try {
      level = std::stoull(read_line(entry.path() / "level"));
    } catch (const std::exception&) {
      continue;
    }
    auto size = parse_size(read_line(entry.path() / "size"));
    const uint64_t cpus = count_cpus(read_line(entry.path() / "shared_cpu_list"));
    if (!size || *size == 0 || level <= best_level) continue;
    best_level = level;
    best_size = *size;
    best_cpus = cpus == 0 ? 1 : cpus;
  }
  if (best_size == 0) return 0;
  if (how) {
    *how = "L" + std::to_string(best_level) + " " + text_size(best_size) + " shared by " + std::to_string(best_cpus) +
           " CPU" + (best_cpus == 1 ? "" : "s");
  }
  return best_size / best_cpus;
}

const Descriptor kCarc = {
    .name = "carc",
    .summary =
        "CARC (slides): credit's posted receives, plus a byte budget sized to the receiver's cache, "
        "debited before sending and replenished only after the receiver processed the data (a put of its "
        "processed counters into a word the sender exposes)",
    .options_help =
        "budget=SIZE: most unprocessed bytes in flight (default: the receiving core's share of its "
        "last-level cache, from /sys/devices/system/cpu/cpu0/cache; at least one block)",
    .receiver_progress = true,
    .receiver_endpoint = true,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
