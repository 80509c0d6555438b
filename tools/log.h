// The daemon's log lines on stderr: timestamped (ISO 8601, milliseconds, UTC offset) and levelled,
// as text or as one JSON object per line (`--log-format json`, for log collectors). Events of the
// receiver and its workers and the library's own warnings all go through here; what a command
// prints as its result (session reports, `listening on`, --json) stays on stdout as it is.
//
//   text: 2026-11-26T19:02:03.123+00:00 info slotstream recv: sender cams connected
//   json: {"time":"2026-11-26T19:02:03.123+00:00","level":"info","logger":"slotstream recv","message":"..."}
#pragma once

#include <string>

namespace slotstream::tools {

// "text" or "json" (the values --log-format takes).
inline constexpr const char* kLogFormats[] = {"text", "json"};

// Makes `name` (e.g. "slotstream recv") the default logger, writing to stderr in `format`, at info
// level. Call once, before any thread that logs is started.
void setup_logging(const std::string& name, const std::string& format);

// One event line at info level, or a warning. Any thread.
void log_info(const std::string& text);
void log_warning(const std::string& text);

}  // namespace slotstream::tools
