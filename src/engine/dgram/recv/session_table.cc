#include "engine/dgram/recv/session_table.h"

#include <vector>

#include "engine/dgram/recv/handshake.h"

namespace slotstream::dgram {

std::string SessionTable::udp_key(const Address& a, uint32_t source_qp) {
  std::string k = a.identity();
  k.append(reinterpret_cast<const char*>(&source_qp), sizeof source_qp);
  return k;
}

Peer* SessionTable::find(const Address& from, uint32_t source_qp) {
  if (last_hit_ && last_hit_->qp == source_qp && !last_hit_->conn && last_hit_->addr == from) return last_hit_;
  auto it = by_key_.find(udp_key(from, source_qp));
  return it == by_key_.end() ? nullptr : (last_hit_ = it->second);
}

Peer* SessionTable::find_any(const Address& from) {
  if (last_hit_ && !last_hit_->conn && last_hit_->addr == from) return last_hit_;
  auto it = by_addr_.find(from.identity());
  return it == by_addr_.end() ? nullptr : it->second;
}

Peer* SessionTable::named(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void SessionTable::add(std::shared_ptr<Peer> p) {
  if (!p->conn) {
    p->key = udp_key(p->addr, p->qp);
    by_key_[p->key] = p.get();
    by_addr_[p->addr.identity()] = p.get();
  }
  by_name_[p->name()] = p.get();
  promised_ += p->reservation;
  peers_.push_back(std::move(p));
}

std::shared_ptr<Peer> SessionTable::remove(Peer& p) {
  std::shared_ptr<Peer> keep;
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->get() == &p) {
      keep = std::move(*it);
      peers_.erase(it);
      break;
    }
  }
  if (last_hit_ == &p) last_hit_ = nullptr;
  if (!p.key.empty()) by_key_.erase(p.key);
  if (auto it = by_addr_.find(p.addr.identity()); it != by_addr_.end() && it->second == &p) by_addr_.erase(it);
  if (auto it = by_name_.find(p.name()); it != by_name_.end() && it->second == &p) by_name_.erase(it);
  if (keep) promised_ -= p.reservation;
  return keep;
}

Peer* SessionTable::eviction_victim() const {
  std::vector<Standing> table;
  std::vector<Peer*> order;
  for (const auto& p : peers_) {
    table.push_back({p->authenticated(), p->session.carried_data(), p->last_heard_ns});
    order.push_back(p.get());
  }
  const auto victim = pick_eviction(table);
  return victim ? order[*victim] : nullptr;
}

Finished* SessionTable::finished(const std::string& key) {
  for (auto& f : finished_) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

void SessionTable::forget_finished(int64_t now_ns) {
  while (!finished_.empty() && finished_.front().until_ns < now_ns) finished_.pop_front();
}

}  // namespace slotstream::dgram
