#include "sink/retention.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <system_error>

namespace slotstream::sink {
namespace fs = std::filesystem;

namespace {

// Past this many numbers to remove at once (a device whose numbers jumped: a stream that moved
// between receivers), the directory is listed instead of trying each number.
constexpr uint64_t kListAbove = 4096;

class KeepNewest final : public MessageSink, public SkippableSink {
 public:
  KeepNewest(std::unique_ptr<DirSink> inner, fs::path dir, uint64_t keep)
      : inner_(std::move(inner)),
        dir_(std::move(dir)),
        keep_(keep) {}

  Status begin(uint16_t device) override { return inner_->begin(device); }
  Status append(uint16_t device, std::span<const std::byte> data) override { return inner_->append(device, data); }
  void abort(uint16_t device) override { inner_->abort(device); }
  Status commit(uint16_t device) override {
    SLOTSTREAM_RETURN_IF_ERROR(inner_->commit(device));
    prune(device, inner_->last_committed(device).seq + 1);
    return Status::ok();
  }
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    Status st = inner_->deliver(batch, stored);
    std::map<uint16_t, bool> seen;
    for (size_t i = 0; i < *stored; ++i) {
      if (seen.emplace(batch[i].device, true).second) {
        if (auto n = inner_->numbering(batch[i].device)) prune(batch[i].device, n->next);
      }
    }
    return st;
  }
  std::optional<Numbering> numbering(uint16_t device) override { return inner_->numbering(device); }
  Status skip_to(uint16_t device, uint64_t seq) override { return inner_->skip_to(device, seq); }

 private:
  // Removes the device's messages numbered below next - keep.
  void prune(uint16_t device, uint64_t next) {
    if (next <= keep_) return;
    const uint64_t below = next - keep_;
    const fs::path dir = dir_ / ("device-" + std::to_string(device));
    auto [it, first] = low_.try_emplace(device, 0);
    uint64_t& low = it->second;
    std::error_code ec;
    if (first || below - std::min(low, below) > kListAbove) {  // messages of earlier runs, or a jump: list
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() != 14 || !n.ends_with(".bin") || n[0] == '.') continue;
        if (std::strtoull(n.c_str(), nullptr, 10) < below) fs::remove(e.path(), ec);
      }
    } else {
      for (uint64_t s = low; s < below; ++s) fs::remove(dir / DirSink::file_name(s), ec);
    }
    low = std::max(low, below);
  }

  std::unique_ptr<DirSink> inner_;
  fs::path dir_;
  uint64_t keep_;
  std::map<uint16_t, uint64_t> low_;  // per device: every number below it has been removed
};

}  // namespace

std::unique_ptr<MessageSink> keep_newest(std::unique_ptr<DirSink> inner, fs::path sender_dir, uint64_t keep) {
  return std::make_unique<KeepNewest>(std::move(inner), std::move(sender_dir), keep);
}

}  // namespace slotstream::sink
