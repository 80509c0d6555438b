#include "engine/ucx/session/transport_choice.h"

#include <map>
#include <vector>

namespace slotstream::session {
namespace {

// "ipc=1,uid=0" as key -> value.
std::map<std::string, std::string> fields(std::string_view domain) {
  std::map<std::string, std::string> out;
  for (size_t pos = 0; pos < domain.size();) {
    size_t comma = std::min(domain.find(',', pos), domain.size());
    std::string_view item = domain.substr(pos, comma - pos);
    size_t eq = item.find('=');
    out[std::string(item.substr(0, eq))] = eq == std::string_view::npos ? "" : std::string(item.substr(eq + 1));
    pos = comma + 1;
  }
  return out;
}

// Why shared memory cannot be used between the two ends; empty when it can.
std::string no_shm(const EndFacts& s, const EndFacts& r) {
  if (s.host_id != r.host_id) return "sender and receiver are on different hosts";
  if (std::string diff = shm_domain_difference(s.shm_domain, r.shm_domain); !diff.empty()) {
    return "the sender runs " + diff + ", where shared memory does not reach";
  }
  if (!s.shm) return "the sender's shm set-up failed";
  if (!r.shm) return "the receiver does not offer shm";
  return {};
}

// Why rdma cannot be used; empty when it can.
std::string no_rdma(const EndFacts& s, const EndFacts& r) {
  if (!s.rdma && !r.rdma) return "neither end has a usable RDMA device";
  if (!s.rdma) return "the sender has no usable RDMA device";
  if (!r.rdma) return "the receiver has no usable RDMA device";
  return {};
}

// auto: the first of shm, rdma, tcp that both ends can use, and why.
TransportChoice pick(const EndFacts& s, const EndFacts& r) {
  const std::string shm_no = no_shm(s, r);
  if (shm_no.empty()) return {Transport::kShm, {}, "sender and receiver share this host and its shared memory"};
  const std::string rdma_no = no_rdma(s, r);
  if (rdma_no.empty()) return {Transport::kRdma, {}, "no shm (" + shm_no + "); both ends have a usable RDMA device"};
  return {Transport::kTcp, {}, "no shm (" + shm_no + "), no rdma (" + rdma_no + ")"};
}

// Whether an explicitly named transport can run between the two ends.
std::string cannot(Transport t, const EndFacts& s, const EndFacts& r) {
  if (t == Transport::kShm && s.host_id != r.host_id)
    return "transport shm needs sender and receiver on one host; use tcp";
  if (t == Transport::kShm) {
    if (std::string why = no_shm(s, r); !why.empty()) return "transport shm cannot be used: " + why + "; use tcp";
  }
  if (t == Transport::kRdma) {
    if (std::string why = no_rdma(s, r); !why.empty()) return "transport rdma: " + why + "; use tcp";
  }
  return {};
}

}  // namespace

std::string shm_domain_difference(std::string_view sender, std::string_view receiver) {
  static const std::map<std::string, std::string> kWhat = {{"ipc", "in another IPC namespace"},
                                                           {"uid", "as another user"}};
  const auto a = fields(sender);
  const auto b = fields(receiver);
  std::vector<std::string> diffs;
  for (const auto& [key, what] : kWhat) {
    auto x = a.find(key), y = b.find(key);
    if (x == a.end() || y == b.end() || x->second != y->second) diffs.push_back(what);
  }
  std::string out;
  for (const auto& d : diffs) out += (out.empty() ? "" : " and ") + d;
  return out;
}

TransportChoice choose_transport(Transport allowed, Transport requested, const EndFacts& sender,
                                 const EndFacts& receiver) {
  if (allowed != Transport::kAuto && requested != Transport::kAuto && requested != allowed) {
    return {std::nullopt, std::string("this receiver only accepts transport ") + transport_name(allowed), {}};
  }
  if (requested == Transport::kAuto && allowed == Transport::kAuto) return pick(sender, receiver);
  const Transport chosen = requested != Transport::kAuto ? requested : allowed;
  if (std::string why = cannot(chosen, sender, receiver); !why.empty()) {
    return {std::nullopt, why, {}};
  }
  const std::string reason = requested != Transport::kAuto ? "the sender asked for it" : "the receiver accepts only it";
  return {chosen, {}, reason};
}

}  // namespace slotstream::session
