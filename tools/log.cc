#include "log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace slotstream::tools {
namespace {

// %* in a pattern: the message as the inside of a JSON string (quotes, backslashes and control
// characters escaped), so a message can never break the line's JSON.
class JsonMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static const char kHex[] = "0123456789abcdef";
    for (char c : msg.payload) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(c);
      } else if (u < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        dest.append(esc, esc + sizeof esc);
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessage>(); }
};

}  // namespace

void setup_logging(const std::string& name, const std::string& format) {
  auto logger = std::make_shared<spdlog::logger>(name, std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (format == "json") {
    formatter->add_flag<JsonMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","logger":"%n","message":"%*"})");
  } else {
    formatter->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l %n: %v");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::info);  // a line is on stderr when it happened (crashes, tests)
  spdlog::set_default_logger(std::move(logger));
}

void log_info(const std::string& text) { spdlog::info("{}", text); }
void log_warning(const std::string& text) { spdlog::warn("{}", text); }

}  // namespace slotstream::tools
