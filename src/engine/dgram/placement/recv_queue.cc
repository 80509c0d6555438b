#include "engine/dgram/placement/recv_queue.h"

#include <climits>

namespace slotstream::dgram {
namespace {

// Finished MSNs kept above the floor before the oldest are forgotten. A message lost entirely
// never finishes here (nothing of it arrived), so without a bound the set would grow with every
// loss; a segment older than what is remembered is then stale by the floor rule instead.
constexpr size_t kRememberedFinished = 4096;

}  // namespace

void ReceiveQueues::post(uint32_t qn, uint32_t count, uint64_t capacity) {
  Queue& q = queues_[qn];
  q.posted = count;
  q.capacity = capacity;
}

void ReceiveQueues::mark_finished(Queue& q, uint32_t msn) {
  q.done.insert(msn);
  while (!q.done.empty() && *q.done.begin() == q.floor) {
    q.done.erase(q.done.begin());
    ++q.floor;
  }
  while (q.done.size() > kRememberedFinished) {
    q.floor = *q.done.begin() + 1;
    q.done.erase(q.done.begin());
  }
}

void ReceiveQueues::post_all(uint32_t count, uint64_t capacity) {
  default_posted_ = count;
  default_capacity_ = capacity;
}

Placed ReceiveQueues::place(uint32_t qn, uint32_t msn, uint64_t offset, std::span<const std::byte> payload, bool last,
                            int64_t now_ns, std::vector<Completion>* out) {
  auto qit = queues_.find(qn);
  if (qit == queues_.end()) {
    if (default_posted_ == 0) return Placed::kUnknownKey;
    qit = queues_.emplace(qn, Queue{default_posted_, default_capacity_, {}, 0, {}}).first;
  }
  Queue& q = qit->second;
  if (finished(q, msn)) return Placed::kStale;
  auto it = q.active.find(msn);
  if (it == q.active.end()) {
    if (q.active.size() >= q.posted) return Placed::kNoBuffer;
    it = q.active.emplace(msn, Assembly(msn, now_ns, now_ns + timeout_ns_)).first;
  }
  Placed p = it->second.place(offset, payload, last, q.capacity);
  if (p == Placed::kPlaced && idle_) it->second.extend_deadline(now_ns + timeout_ns_);
  if ((p == Placed::kPlaced || p == Placed::kDuplicate || p == Placed::kConflict) && it->second.complete()) {
    out->push_back(it->second.finish(qn, Outcome::kComplete, now_ns));
    q.active.erase(it);
    mark_finished(q, msn);
    return Placed::kCompleted;
  }
  return p;
}

void ReceiveQueues::expire(int64_t now_ns, std::vector<Completion>* out) {
  for (auto& [qn, q] : queues_) {
    for (auto it = q.active.begin(); it != q.active.end();) {
      if (it->second.deadline_ns() <= now_ns) {
        const uint32_t msn = it->first;
        out->push_back(it->second.finish(qn, Outcome::kIncomplete, now_ns));
        it = q.active.erase(it);
        mark_finished(q, msn);
      } else {
        ++it;
      }
    }
  }
}

void ReceiveQueues::extend_all(int64_t deadline_ns) {
  for (auto& [_, q] : queues_) {
    for (auto& [_, a] : q.active) a.extend_deadline(deadline_ns);
  }
}

int64_t ReceiveQueues::next_deadline() const {
  int64_t d = INT64_MAX;
  for (const auto& [_, q] : queues_) {
    for (const auto& [_, a] : q.active) d = std::min(d, a.deadline_ns());
  }
  return d;
}

size_t ReceiveQueues::outstanding() const {
  size_t n = 0;
  for (const auto& [_, q] : queues_) n += q.active.size();
  return n;
}

}  // namespace slotstream::dgram
