// The end of `slotstream send`, whichever transport carried it: one summary schema (--json) and one
// human summary, and its errors (docs/cli-contract.md).
#include <cstdio>

#include "cli_util.h"
#include "interrupt.h"
#include "send_plan.h"

namespace slotstream::tools {

int exit_code_of(const Status& st) { return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError; }

void fill_summary(const Fillers& fillers, std::chrono::steady_clock::time_point t0, double cpu0, SendSummary* s) {
  s->devices = fillers.sent();
  s->messages = 0;
  for (const auto& [d, n] : s->devices) s->messages += n;
  s->bytes = fillers.sent_bytes();
  s->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s->cpu_seconds = cpu_seconds() - cpu0;
  s->late_frames = fillers.late_frames();
}

namespace {

nlohmann::json error_fields(int exit_code, const Status& error) {
  return {{"ok", exit_code == 0},
          {"exit_code", exit_code},
          {"error", error.is_ok() ? nlohmann::json() : nlohmann::json(error.message())},
          {"code", error.is_ok() ? nlohmann::json() : nlohmann::json(code_name(error.code()))}};
}

void print_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

std::string human_summary(const SendSummary& s) {
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f s (%.1f MB/s)", s.seconds, s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  std::string line = "sent " + std::to_string(s.messages) + " messages of " + std::to_string(s.devices.size()) +
                     " device" + (s.devices.size() == 1 ? "" : "s") + ", " + format_size(s.bytes) + ", in " + rate +
                     " over " + s.transport + " (" + s.protocol + "); " + std::to_string(s.late_frames) +
                     " late frames";
  if (s.interrupted) {
    line += std::string("\ninterrupted by ") + signal_name(s.interrupted) +
            ": stopped early; the receiver confirmed every message sent (a clean finish, not a lost sender)";
  }
  return line;
}

}  // namespace

nlohmann::json summary_json(const SendSummary& s, int exit_code, const Status& error) {
  nlohmann::json j = error_fields(exit_code, error);
  j["interrupted"] = s.interrupted ? nlohmann::json(signal_name(s.interrupted)) : nlohmann::json();
  j["messages"] = s.messages;
  j["bytes"] = s.bytes;
  j["seconds"] = s.seconds;
  j["mb_per_s"] = s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0;
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [d, n] : s.devices) per[std::to_string(d)] = n;
  j["devices"] = per;
  j["cpu_seconds"] = s.cpu_seconds;
  j["transport"] = s.transport;
  j["transport_reason"] = s.transport_reason;
  j["protocol"] = s.protocol;
  j["blocks"] = s.blocks;
  j["block_size"] = s.block_size ? nlohmann::json(*s.block_size) : nlohmann::json();
  j["late_frames"] = s.late_frames;
  for (const auto& [k, v] : s.extra.items()) j[k] = v;
  return j;
}

int report_send(const SendArgs& a, const Plan& plan, const SendSummary& s, const Status& st) {
  const int rc = !st.is_ok() ? exit_code_of(st) : s.interrupted ? 128 + s.interrupted : kExitOk;
  if (!st.is_ok()) print_error("send", st.message());
  warn_late_frames(s.late_frames, plan);
  Status error = st;
  if (error.is_ok() && s.interrupted)
    error = {Code::kCancelled, std::string("interrupted by ") + signal_name(s.interrupted)};
  if (a.json) {
    print_json(summary_json(s, rc, error));
  } else if (st.is_ok()) {
    print_line(stdout, human_summary(s));
  }
  return rc;
}

void print_send_error_json(const Status& st, int rc) { print_json(error_fields(rc, st)); }

int send_failed(const SendArgs& a, const Status& st, int rc) {
  print_error("send", st.message());
  if (a.json) print_send_error_json(st, rc);
  return rc;
}

}  // namespace slotstream::tools
