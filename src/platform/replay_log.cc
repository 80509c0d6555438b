#include "platform/replay_log.h"

namespace slotstream::platform {

uint64_t ReplayLog::append(std::vector<std::byte> message) {
  bytes_ += message.size();
  messages_.push_back(std::move(message));
  return next() - 1;
}

void ReplayLog::confirm(uint64_t begin, uint64_t stored) {
  const uint64_t upto = begin + stored;
  while (confirmed_ < upto && !messages_.empty()) {
    bytes_ -= messages_.front().size();
    messages_.pop_front();
    ++confirmed_;
  }
}

}  // namespace slotstream::platform
