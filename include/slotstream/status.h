// slotstream's one status type. Every fallible call returns a Status; "in progress" is not an
// error. Exceptions are thrown only by constructors/factories and caught at the CLI boundary.
#pragma once

#include <string>
#include <utility>

namespace slotstream {

enum class Code {
  kOk = 0,
  kInProgress,  // not an error: the operation continues
  // usage / configuration
  kInvalidArgument,
  // connection set-up (control socket, hello, authentication)
  kConnectFailed,
  kProtocolError,  // malformed or unexpected control message
  kVersionMismatch,
  kRefused,  // the peer said no (reason in the message)
  kAuthFailed,
  // data path
  kPeerGone,        // control socket EOF or transport error: the other side died
  kTransportError,  // UCX reported an error
  kIoError,         // local file system (disk full, permissions)
  kTimeout,
  kCancelled,  // shutdown was requested
  kBusy,       // not now: the data waits and the call is retried (e.g. worker backlog)
};

const char* code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>", for logs and CLI errors.
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Propagates a non-ok Status to the caller.
#define SLOTSTREAM_RETURN_IF_ERROR(expr) \
  do {                                   \
    ::slotstream::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;        \
  } while (0)

}  // namespace slotstream
