// The CLI's platform options and commands (tools/platform_cli.cc, tools/edge.cc).
#pragma once

#include <functional>
#include <memory>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "send_plan.h"
#include "slotstream/platform.h"

namespace slotstream::tools {

void add_platform_recv(CLI::App* recv, PlatformArgs* p);
void add_platform_send(CLI::App* send, PlatformArgs* p);
void add_platform_common(CLI::App* app, PlatformArgs* p);
// --platform-cacert, --platform-cert, --platform-key, --platform-user, --platform-password-file.
void add_platform_access(CLI::App* app, PlatformAccessArgs* a);
// The access options as PlatformSecurity (the password read from its file; a file every user of the
// host may read is warned about). kInvalidArgument says what is wrong.
Status platform_security(const PlatformAccessArgs& a, PlatformSecurity* out);
// send and edge: --stall-timeout DURATION (SenderOptions::stall_timeout).
void add_stall_timeout(CLI::App* app, double* seconds);
// --need-*: per_device for edge (each offloaded device's share), else the sender's whole need.
void add_platform_need(CLI::App* app, PlatformArgs* p, bool per_device);

// What a plan needs of a receiver: --need-* or what --synthetic implies.
Status platform_need(const PlatformArgs& p, const Plan& plan, PlatformNeed* out);

// send/edge --platform: check_sender_options, the need, and the platform options; `cmd` ("send",
// "edge") prefixes the platform's events. An error says what is wrong (exit_code_of).
Status platform_sender_options(const SendArgs& a, Plan* plan, PlatformSenderOptions* po, const std::string& cmd);

// recv --platform: registers the started receiver. kExitOk, or the exit code after printing why not.
int register_on_platform(const RecvArgs& args, const Receiver& rx, std::function<uint64_t()> backlog,
                         std::unique_ptr<PlatformRegistration>* out);

struct PlatformStatusArgs {
  std::string url;
  PlatformAccessArgs access;
  bool json = false;
};
CLI::App* add_platform_status(CLI::App& app, PlatformStatusArgs* args);
int run_platform_status(const PlatformStatusArgs& args);

// `slotstream edge` (tools/edge.cc).
struct EdgeArgs {
  SendArgs source;  // what its devices produce, the name, --platform and the options towards receivers
  std::string out;
  std::string worker;
  uint64_t backlog_messages = 0;
  std::string load = "cpu";
  double above = 80;
  double below = 50;
  double settle = 2;
};
CLI::App* add_edge(CLI::App& app, EdgeArgs* args);
int run_edge(const EdgeArgs& args);

}  // namespace slotstream::tools
