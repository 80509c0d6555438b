// The public forms of the control plane's parsers (slotstream.h): what the CLI uses, so that programs and
// the GStreamer elements parse addresses and token files the same way.
#include "net/auth.h"
#include "net/control_socket.h"
#include "slotstream/slotstream.h"

namespace slotstream {

Status parse_address(std::string_view text, std::string* host, uint16_t* port) {
  return net::parse_host_port(std::string(text), host, port);
}

Status read_token_file(const std::string& path, std::string* token) { return net::read_token_file(path, token); }

}  // namespace slotstream
