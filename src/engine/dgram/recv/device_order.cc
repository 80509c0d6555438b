#include "engine/dgram/recv/device_order.h"

#include <algorithm>
#include <climits>

namespace slotstream::dgram {

DeviceOrder::Check DeviceOrder::check(uint32_t msn) const {
  if (msn < next_) return Check::kReleased;
  if (msn - next_ > kMaxAhead) return Check::kTooFarAhead;
  return Check::kOk;
}

void DeviceOrder::seen(uint32_t msn, int64_t now_ns) {
  if (check(msn) != Check::kOk || done_.contains(msn)) return;
  active_.insert(msn);
  if (msn >= seen_end_) {
    if (msn > seen_end_) gaps_[seen_end_] = {msn, now_ns};
    seen_end_ = uint64_t(msn) + 1;
    return;
  }
  // A message inside a gap turned up after all: split the gap around it.
  auto it = gaps_.upper_bound(msn);
  if (it == gaps_.begin()) return;
  --it;
  if (msn >= it->second.end) return;
  const Gap g = it->second;
  const uint64_t first = it->first;
  gaps_.erase(it);
  if (first < msn) gaps_[first] = {msn, g.since_ns};
  if (uint64_t(msn) + 1 < g.end) gaps_[uint64_t(msn) + 1] = {g.end, g.since_ns};
}

void DeviceOrder::finished(Completion c, int64_t now_ns) {
  const uint32_t msn = c.msn;
  seen(msn, now_ns);  // a one-segment message finishes when it is first seen
  if (!active_.erase(msn)) return;
  done_.emplace(msn, std::move(c));
}

void DeviceOrder::fin(uint64_t count, int64_t now_ns) {
  if (fin_count_) return;
  fin_count_ = count;
  if (count > seen_end_) {
    gaps_[seen_end_] = {count, now_ns};
    seen_end_ = count;
  }
}

void DeviceOrder::poll(int64_t now_ns, std::vector<Release>* out) {
  for (;;) {
    if (fin_count_ && next_ >= *fin_count_) return;
    auto d = done_.find(next_);
    if (d != done_.end()) {
      Release r;
      r.msn = uint32_t(next_);
      r.kind = d->second.outcome == Outcome::kComplete ? Kind::kComplete : Kind::kIncomplete;
      r.completion = std::move(d->second);
      done_.erase(d);
      out->push_back(std::move(r));
      ++next_;
      continue;
    }
    if (active_.contains(next_)) return;  // its own timer will finish it
    auto g = gaps_.begin();
    if (g == gaps_.end() || g->first > next_) return;  // not known to exist yet
    if (now_ns - g->second.since_ns < timeout_ns_) return;
    // Nothing inside a gap was seen (seen() splits it), so the rest of it is one run of losses.
    const uint64_t end = fin_count_ ? std::min(g->second.end, *fin_count_) : g->second.end;
    if (end <= next_) {
      gaps_.erase(g);
      continue;
    }
    out->push_back(Release{uint32_t(next_), Kind::kLost, end - next_, std::nullopt});
    const Gap rest = g->second;
    next_ = end;
    gaps_.erase(g);
    if (next_ < rest.end) gaps_[next_] = rest;
  }
}

int64_t DeviceOrder::next_deadline() const {
  // Only the gap at the head can be released by a timer: a later one waits for the head anyway, and
  // a head still being placed is finished by its own timer (its target's). Reporting a later gap's
  // deadline made the receiver's loop spin once it had passed (up to a reliable message's 30 s).
  if (gaps_.empty() || active_.contains(next_) || done_.contains(next_)) return INT64_MAX;
  if (fin_count_ && next_ >= *fin_count_) return INT64_MAX;
  auto g = gaps_.begin();
  if (g->first > next_) return INT64_MAX;
  return g->second.since_ns + timeout_ns_;
}

}  // namespace slotstream::dgram
