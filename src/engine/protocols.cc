// The one protocol registry view (slotstream::protocols(), `slotstream protocols`): both engines'
// registries — the block protocols of src/engine/ucx/protocol and the datagram protocols of src/engine/dgram — each
// entry naming its engine and the transports it runs on; and which engine runs a sender's options.
#include "engine/contract.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/ucx/protocol/protocol.h"
#include "slotstream/slotstream.h"

namespace slotstream {

std::vector<ProtocolInfo> protocols(bool with_references) {
  std::vector<ProtocolInfo> out = protocol::infos(with_references);
  for (ProtocolInfo& p : dgram::infos()) out.push_back(std::move(p));
  return out;
}

namespace engine {

Kind engine_for(Transport transport, const std::string& protocol) {
  if (transport == Transport::kUdp) return Kind::kDatagram;
  const std::string name = protocol.substr(0, protocol.find(':'));
  return dgram::find_protocol(name) ? Kind::kDatagram : Kind::kUcx;
}

}  // namespace engine
}  // namespace slotstream
