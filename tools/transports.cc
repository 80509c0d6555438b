// `slotstream transports [--json]`: what this host offers (the library's host_transports()).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"

namespace slotstream::tools {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// "Ethernet" is RoCE to an RDMA user.
std::string link_layer(const std::string& l) { return l == "Ethernet" ? "Ethernet (RoCE)" : l; }

}  // namespace

int run_transports(bool json, const RdmaOptions& rdma) {
  const std::vector<TransportInfo> list = host_transports(rdma);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const TransportInfo& t : list) {
      nlohmann::json ports = nlohmann::json::array();
      for (const RdmaPort& p : t.ports) {
        ports.push_back(
            {{"name", p.name}, {"state", p.state}, {"link_layer", p.link_layer}, {"ucx_transports", p.ucx_transports}});
      }
      out.push_back({{"name", t.name}, {"available", t.available}, {"why", t.why}, {"ports", ports}});
    }
    std::printf("%s\n", out.dump(1).c_str());
    return kExitOk;
  }
  for (const TransportInfo& t : list) {
    std::printf("%-5s %-3s %s\n", t.name.c_str(), t.available ? "yes" : "no", t.why.c_str());
    for (const RdmaPort& p : t.ports) {
      std::printf("      %-12s %-8s %-16s %s\n", p.name.c_str(), p.state.empty() ? "?" : p.state.c_str(),
                  p.link_layer.empty() ? "?" : link_layer(p.link_layer).c_str(),
                  p.ucx_transports.empty() ? "(UCX offers nothing here)" : join(p.ucx_transports).c_str());
    }
  }
  return kExitOk;
}

}  // namespace slotstream::tools
