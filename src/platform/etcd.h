// The platform's state lives in etcd (v3). This is slotstream's whole client of it: etcd's v3
// JSON gateway (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/lease/grant|keepalive|revoke;
// keys and values base64, 64-bit numbers as strings), spoken through libcurl. Why the gateway
// and not gRPC: docs/platform.md.
//
// A client knows every member of the cluster and asks them in turn: a member that cannot be
// reached, or answers that it has no leader, is skipped for the next, so one member down changes
// nothing. etcd serves linearizable reads and transactions from any member.
//
// A protected etcd (docs/platform.md, "Protecting the platform"): TLS (https, the members'
// certificates checked against a CA, optionally a client certificate) and etcd's own users
// (POST /v3/auth/authenticate gives a token sent as the Authorization header of every request; a
// token that expired is fetched again once).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "slotstream/platform.h"
#include "slotstream/status.h"

namespace slotstream::platform {

// "etcd://HOST:PORT[,HOST:PORT...]" -> {"HOST:PORT", ...}. kInvalidArgument says what is wrong.
Status parse_etcd_url(const std::string& url, std::vector<std::string>* endpoints);

// Everything a client needs to reach the cluster: its members, and how to prove who it is.
struct EtcdConfig {
  std::vector<std::string> endpoints;  // HOST:PORT of every member
  PlatformSecurity security;           // TLS when it names a CA or a client certificate
};
// The URL and the security options, checked: the files exist and are readable, a client
// certificate comes with its key, a user with a password. kInvalidArgument says what is wrong.
Status etcd_config(const std::string& url, const PlatformSecurity& security, EtcdConfig* out);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One comparison of a transaction (etcd's Compare): the key's version, mod revision or create
// revision against `value`. With `range_end`, every key in [key, range_end) must pass (etcd >= 3.3); a key that
// does not exist has version and mod revision 0.
struct Compare {
  enum class Target { kVersion, kMod, kCreate };
  enum class Result { kEqual, kGreater, kLess };
  std::string key;
  std::string range_end;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t value = 0;
};

// One operation of a transaction: put (with a lease, or none: 0) or delete of one key.
struct Op {
  enum class Kind { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;
  int64_t lease = 0;
};

// The end of the range of every key that starts with `prefix` (etcd's "prefix + 1").
std::string prefix_end(const std::string& prefix);

// Threading: every call may come from any thread (one request at a time per client).
class EtcdClient {
 public:
  // `timeout_ms` per request and member. Nothing is sent yet (a user's token is asked for with the
  // first request).
  static Status create(EtcdConfig config, std::unique_ptr<EtcdClient>* out, long timeout_ms = 2000);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::vector<std::string>& endpoints() const { return config_.endpoints; }

  // Every key starting with `prefix`, and the store's revision they were read at.
  Status range_prefix(const std::string& prefix, std::vector<KeyValue>* out, int64_t* revision);
  // One key: nullopt when it does not exist.
  Status get(const std::string& key, std::optional<KeyValue>* out);
  Status put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status remove(const std::string& key);
  // If every comparison holds, the `success` operations, all at one revision; `*succeeded` says.
  // `*revision` (may be null): the store's revision after it (a key the transaction created has it
  // as its create revision).
  Status txn(const std::vector<Compare>& compares, const std::vector<Op>& success, bool* succeeded,
             int64_t* revision = nullptr);

  Status lease_grant(int64_t ttl_seconds, int64_t* id);
  // One keep-alive: `*ttl` is what is left of the lease, 0 when it has expired (or never was).
  Status lease_keepalive(int64_t id, int64_t* ttl);
  Status lease_revoke(int64_t id);

 private:
  EtcdClient(EtcdConfig config, long timeout_ms);
  // POSTs `body` (JSON) to `path` on the members in turn, from the last one that answered;
  // `*reply` is the JSON text of the first real answer. With a user: authenticates first, and
  // once more when etcd says the token is no longer valid.
  Status post(const std::string& path, const std::string& body, std::string* reply);
  Status post_members(const std::string& path, const std::string& body, std::string* reply, long* http);
  Status post_one(const std::string& endpoint, const std::string& path, const std::string& body, long* http,
                  std::string* reply);
  // Under mutex_: a token for the configured user (POST /v3/auth/authenticate).
  Status authenticate();

  EtcdConfig config_;
  long timeout_ms_;
  std::mutex mutex_;
  size_t current_ = 0;  // the member that answered last
  std::string token_;   // etcd's auth token for config_.security.user ("" none yet)
  void* curl_ = nullptr;
};

}  // namespace slotstream::platform
