#include "platform/etcd.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <nlohmann/json.hpp>

namespace slotstream::platform {

using nlohmann::json;

namespace {

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(size_t(n));
  return out;
}

bool unbase64(const std::string& in, std::string* out) {
  if (in.size() % 4 != 0) return false;
  std::string buf(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(buf.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return false;
  size_t pad = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '=' && pad < 2; --i) ++pad;
  buf.resize(size_t(n) - pad);  // EVP_DecodeBlock counts the padding as zero bytes
  *out = std::move(buf);
  return true;
}

// The gateway writes 64-bit integers as strings and leaves out fields that are zero. Anything that
// is not a number reads as 0 (a key without a lease, a revision that matches nothing).
int64_t number(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  int64_t v = 0;
  if (it->is_string()) {
    const std::string& t = it->get_ref<const std::string&>();
    if (std::from_chars(t.data(), t.data() + t.size(), v).ec != std::errc()) return 0;
    return v;
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

Status parse_reply(const std::string& text, json* out) {
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    return {Code::kProtocolError, "etcd answered something that is not JSON: " + text.substr(0, 200)};
  }
  return Status::ok();
}

size_t collect(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

constexpr const char* kAuthenticate = "/v3/auth/authenticate";

const char* target_name(Compare::Target t) {
  switch (t) {
    case Compare::Target::kMod:
      return "MOD";
    case Compare::Target::kCreate:
      return "CREATE";
    case Compare::Target::kVersion:
      break;
  }
  return "VERSION";
}

const char* target_field(Compare::Target t) {
  switch (t) {
    case Compare::Target::kMod:
      return "mod_revision";
    case Compare::Target::kCreate:
      return "create_revision";
    case Compare::Target::kVersion:
      break;
  }
  return "version";
}

const char* result_name(Compare::Result r) {
  switch (r) {
    case Compare::Result::kEqual:
      return "EQUAL";
    case Compare::Result::kGreater:
      return "GREATER";
    case Compare::Result::kLess:
      return "LESS";
  }
  return "EQUAL";
}

json compare_json(const Compare& c) {
  json j = {{"key", base64(c.key)}, {"target", target_name(c.target)}, {"result", result_name(c.result)}};
  if (!c.range_end.empty()) j["range_end"] = base64(c.range_end);
  j[target_field(c.target)] = std::to_string(c.value);
  return j;
}

// The gateway's error: {"error": ..., "code": ..., "message": ...} (etcd 3.4: "message").
std::string error_message(const json& j, long http) {
  for (const char* field : {"message", "error"}) {
    if (j.contains(field) && j[field].is_string() && !j[field].get<std::string>().empty()) return j[field];
  }
  return "HTTP " + std::to_string(http);
}

// etcd's answer to a request without a valid token while authentication is on: "user name is
// empty" (none sent), "invalid auth token" (expired, or etcd restarted).
bool token_refused(const std::string& message) {
  return message.find("invalid auth token") != std::string::npos ||
         message.find("user name is empty") != std::string::npos ||
         message.find("auth token is expired") != std::string::npos;
}

KeyValue key_value(const json& e, bool* ok) {
  KeyValue kv;
  *ok = unbase64(e.value("key", ""), &kv.key) && unbase64(e.value("value", ""), &kv.value);
  kv.create_revision = number(e, "create_revision");
  kv.mod_revision = number(e, "mod_revision");
  kv.version = number(e, "version");
  kv.lease = number(e, "lease");
  return kv;
}

json op_json(const Op& op) {
  if (op.kind == Op::Kind::kDelete) return {{"request_delete_range", {{"key", base64(op.key)}}}};
  json put = {{"key", base64(op.key)}, {"value", base64(op.value)}};
  if (op.lease) put["lease"] = std::to_string(op.lease);
  return {{"request_put", put}};
}

}  // namespace

Status parse_etcd_url(const std::string& url, std::vector<std::string>* endpoints) {
  const std::string scheme = "etcd://";
  const std::string usage = "expected etcd://HOST:PORT[,HOST:PORT...] (the etcd members' client addresses), got '";
  if (!url.starts_with(scheme) || url.size() == scheme.size()) return {Code::kInvalidArgument, usage + url + "'"};
  std::vector<std::string> out;
  const std::string list = url.substr(scheme.size());
  for (size_t pos = 0; pos <= list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string member = list.substr(pos, comma - pos);
    const size_t colon = member.rfind(':');
    if (member.empty() || colon == std::string::npos || colon == 0 || colon + 1 == member.size() ||
        member.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
        member.find('/') != std::string::npos) {
      return {Code::kInvalidArgument, usage + url + "'"};
    }
    out.push_back(member);
    pos = comma + 1;
  }
  *endpoints = std::move(out);
  return Status::ok();
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = char(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

Status readable(const std::string& path, const char* what) {
  if (::access(path.c_str(), R_OK) != 0) {
    return {Code::kInvalidArgument, std::string(what) + " '" + path + "' cannot be read: " + strerror(errno)};
  }
  return Status::ok();
}

}  // namespace

Status etcd_config(const std::string& url, const PlatformSecurity& security, EtcdConfig* out) {
  EtcdConfig c;
  SLOTSTREAM_RETURN_IF_ERROR(parse_etcd_url(url, &c.endpoints));
  const PlatformSecurity& s = security;
  if (s.cert.empty() != s.key.empty()) {
    return {Code::kInvalidArgument,
            "a client certificate needs its key, and a key its certificate (--platform-cert with --platform-key)"};
  }
  if (!s.cacert.empty()) SLOTSTREAM_RETURN_IF_ERROR(readable(s.cacert, "the etcd CA certificate"));
  if (!s.cert.empty()) SLOTSTREAM_RETURN_IF_ERROR(readable(s.cert, "the etcd client certificate"));
  if (!s.key.empty()) SLOTSTREAM_RETURN_IF_ERROR(readable(s.key, "the etcd client key"));
  if (s.user.empty() != s.password.empty()) {
    return {Code::kInvalidArgument,
            "etcd authentication needs a user and a password (--platform-user with --platform-password-file)"};
  }
  c.security = s;
  *out = std::move(c);
  return Status::ok();
}

EtcdClient::EtcdClient(EtcdConfig config, long timeout_ms) : config_(std::move(config)), timeout_ms_(timeout_ms) {}

EtcdClient::~EtcdClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Status EtcdClient::create(EtcdConfig config, std::unique_ptr<EtcdClient>* out, long timeout_ms) {
  if (config.endpoints.empty()) return {Code::kInvalidArgument, "no etcd member to talk to"};
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);  // once, before any thread uses curl
  if (global != CURLE_OK) return {Code::kConnectFailed, "libcurl: " + std::string(curl_easy_strerror(global))};
  std::unique_ptr<EtcdClient> c(new EtcdClient(std::move(config), timeout_ms));
  c->curl_ = curl_easy_init();
  if (!c->curl_) return {Code::kConnectFailed, "libcurl: cannot create a handle"};
  *out = std::move(c);
  return Status::ok();
}

Status EtcdClient::post_one(const std::string& endpoint, const std::string& path, const std::string& body, long* http,
                            std::string* reply) {
  CURL* c = static_cast<CURL*>(curl_);
  const PlatformSecurity& sec = config_.security;
  curl_easy_reset(c);
  const std::string url = (sec.tls() ? "https://" : "http://") + endpoint + path;
  reply->clear();
  char error[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms_);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms_, 500L));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");  // the members are addressed directly
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, reply);
  // TLS: the member's certificate must be signed by the CA and name the host asked for (libcurl
  // checks both by default, and nothing here turns that off).
  if (!sec.cacert.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, sec.cacert.c_str());
  if (!sec.cert.empty()) {
    curl_easy_setopt(c, CURLOPT_SSLCERT, sec.cert.c_str());
    curl_easy_setopt(c, CURLOPT_SSLKEY, sec.key.c_str());
  }
  curl_slist* headers = nullptr;
  const std::string auth = "Authorization: " + token_;
  if (!token_.empty() && path != kAuthenticate) headers = curl_slist_append(headers, auth.c_str());
  if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(c);
  if (headers) curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    std::string why = endpoint + ": " + (error[0] ? error : curl_easy_strerror(rc));
    if (why.find("wrong version number") != std::string::npos) {
      why += " (is this member serving plain http? then give no --platform-cacert)";
    } else if (!sec.tls() && rc == CURLE_GOT_NOTHING) {
      why += " (does this member serve TLS? then give --platform-cacert)";
    } else if (sec.tls() && sec.cert.empty() && rc != CURLE_PEER_FAILED_VERIFICATION &&
               rc != CURLE_OPERATION_TIMEDOUT && why.find("refused") == std::string::npos) {
      // A member that wants a client certificate (etcd --client-cert-auth) ends the connection once
      // TLS 1.3's handshake is over; how that shows differs ("alert bad certificate", "getpeername()
      // failed", ...).
      why += " (if this member asks for a client certificate: give --platform-cert and --platform-key)";
    }
    return {Code::kConnectFailed, why};
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, http);
  return Status::ok();
}

// One request, to the members in turn from the last one that answered: a member that is down, or
// has lost its leader (HTTP 503), cannot answer, so the next one is asked. `*http`: the answer's.
Status EtcdClient::post_members(const std::string& path, const std::string& body, std::string* reply, long* http) {
  std::string failures;
  for (size_t tried = 0; tried < config_.endpoints.size(); ++tried) {
    const std::string& endpoint = config_.endpoints[current_];
    *http = 0;
    Status st = post_one(endpoint, path, body, http, reply);
    if (st.is_ok() && *http < 500) return Status::ok();
    failures +=
        (failures.empty() ? "" : "; ") + (st.is_ok() ? endpoint + ": HTTP " + std::to_string(*http) : st.message());
    current_ = (current_ + 1) % config_.endpoints.size();
  }
  return {Code::kConnectFailed, "no etcd member answered (" + failures + ")"};
}

// etcd v3 authentication: the user's password for a token (a "simple" token lives 5 minutes unused
// by default, a JWT as etcd's --auth-token says); post() sends it with every request.
Status EtcdClient::authenticate() {
  token_.clear();
  const PlatformSecurity& sec = config_.security;
  const json req = {{"name", sec.user}, {"password", sec.password}};
  std::string text;
  long http = 0;
  SLOTSTREAM_RETURN_IF_ERROR(post_members(kAuthenticate, req.dump(), &text, &http));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  if (http == 200 && j.contains("token") && j["token"].is_string() && !j["token"].get<std::string>().empty()) {
    token_ = j["token"].get<std::string>();
    return Status::ok();
  }
  const std::string why = error_message(j, http);
  if (why.find("authentication is not enabled") != std::string::npos) return Status::ok();  // no token to send
  return {Code::kAuthFailed, "etcd refused user '" + sec.user + "': " + why};
}

Status EtcdClient::post(const std::string& path, const std::string& body, std::string* reply) {
  std::lock_guard lock(mutex_);
  const bool with_user = !config_.security.user.empty();
  if (with_user && token_.empty()) SLOTSTREAM_RETURN_IF_ERROR(authenticate());
  for (int attempt = 0;; ++attempt) {
    long http = 0;
    SLOTSTREAM_RETURN_IF_ERROR(post_members(path, body, reply, &http));
    if (http == 200) return Status::ok();
    json err;
    const std::string message = parse_reply(*reply, &err).is_ok() ? error_message(err, http) : "";
    if (token_refused(message)) {
      if (with_user && attempt == 0) {  // the token expired: once more, with a fresh one
        SLOTSTREAM_RETURN_IF_ERROR(authenticate());
        continue;
      }
      return {Code::kAuthFailed, "etcd: " + message +
                                     (with_user ? std::string()
                                                : " (etcd has authentication on: give --platform-user and "
                                                  "--platform-password-file)")};
    }
    if (message.find("permission denied") != std::string::npos) {
      return {Code::kAuthFailed, "etcd: " + message + " (etcd user '" + config_.security.user + "' may not use " +
                                     path +
                                     " on these keys: docs/platform.md, \"Protecting the platform\", has the "
                                     "roles)"};
    }
    if (http == 400 && reply->find("HTTPS server") != std::string::npos) {
      return {Code::kConnectFailed, "etcd " + config_.endpoints[current_] +
                                        " serves TLS and was asked over plain http: give --platform-cacert"};
    }
    if (!message.empty()) return {Code::kRefused, "etcd: " + message};
    return {Code::kProtocolError, "etcd " + config_.endpoints[current_] + " answered HTTP " + std::to_string(http)};
  }
}

Status EtcdClient::range_prefix(const std::string& prefix, std::vector<KeyValue>* out, int64_t* revision) {
  const json req = {{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}};
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/kv/range", req.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  std::vector<KeyValue> kvs;
  for (const auto& e : j.value("kvs", json::array())) {
    bool ok = false;
    kvs.push_back(key_value(e, &ok));
    if (!ok) return {Code::kProtocolError, "etcd sent a key or value that is not base64"};
  }
  *revision = number(j.value("header", json::object()), "revision");
  *out = std::move(kvs);
  return Status::ok();
}

Status EtcdClient::get(const std::string& key, std::optional<KeyValue>* out) {
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/kv/range", json{{"key", base64(key)}}.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  const json kvs = j.value("kvs", json::array());
  if (kvs.empty()) {
    out->reset();
    return Status::ok();
  }
  bool ok = false;
  KeyValue kv = key_value(kvs[0], &ok);
  if (!ok) return {Code::kProtocolError, "etcd sent a key or value that is not base64"};
  *out = std::move(kv);
  return Status::ok();
}

Status EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  json req = {{"key", base64(key)}, {"value", base64(value)}};
  if (lease) req["lease"] = std::to_string(lease);
  std::string text;
  return post("/v3/kv/put", req.dump(), &text);
}

Status EtcdClient::remove(const std::string& key) {
  std::string text;
  return post("/v3/kv/deleterange", json{{"key", base64(key)}}.dump(), &text);
}

Status EtcdClient::txn(const std::vector<Compare>& compares, const std::vector<Op>& success, bool* succeeded,
                       int64_t* revision) {
  json req = {{"compare", json::array()}, {"success", json::array()}};
  for (const auto& c : compares) req["compare"].push_back(compare_json(c));
  for (const auto& op : success) req["success"].push_back(op_json(op));
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/kv/txn", req.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  *succeeded = j.value("succeeded", false);
  if (revision) *revision = number(j.value("header", json::object()), "revision");
  return Status::ok();
}

Status EtcdClient::lease_grant(int64_t ttl_seconds, int64_t* id) {
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/lease/grant", json{{"TTL", std::to_string(ttl_seconds)}}.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  if (j.contains("error") && !j["error"].get<std::string>().empty()) {
    return {Code::kRefused, "etcd: " + j["error"].get<std::string>()};
  }
  *id = number(j, "ID");
  if (*id == 0) return {Code::kProtocolError, "etcd granted no lease: " + text.substr(0, 200)};
  return Status::ok();
}

Status EtcdClient::lease_keepalive(int64_t id, int64_t* ttl) {
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/lease/keepalive", json{{"ID", std::to_string(id)}}.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  // A streaming call through the gateway: the one answer comes as {"result": {...}}.
  *ttl = number(j.value("result", json::object()), "TTL");
  return Status::ok();
}

Status EtcdClient::lease_revoke(int64_t id) {
  std::string text;
  return post("/v3/lease/revoke", json{{"ID", std::to_string(id)}}.dump(), &text);
}

}  // namespace slotstream::platform
