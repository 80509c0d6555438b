#include "platform/etcd.h"

#include <curl/curl.h>
#include <openssl/evp.h>

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

// The gateway writes 64-bit integers as strings and leaves out fields that are zero.
int64_t number(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number()) return it->get<int64_t>();
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

const char* target_name(Compare::Target t) { return t == Compare::Target::kMod ? "MOD" : "VERSION"; }

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
  j[c.target == Compare::Target::kMod ? "mod_revision" : "version"] = std::to_string(c.value);
  return j;
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

EtcdClient::EtcdClient(std::vector<std::string> endpoints, long timeout_ms)
    : endpoints_(std::move(endpoints)),
      timeout_ms_(timeout_ms) {}

EtcdClient::~EtcdClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Status EtcdClient::create(std::vector<std::string> endpoints, std::unique_ptr<EtcdClient>* out, long timeout_ms) {
  if (endpoints.empty()) return {Code::kInvalidArgument, "no etcd member to talk to"};
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);  // once, before any thread uses curl
  if (global != CURLE_OK) return {Code::kConnectFailed, "libcurl: " + std::string(curl_easy_strerror(global))};
  std::unique_ptr<EtcdClient> c(new EtcdClient(std::move(endpoints), timeout_ms));
  c->curl_ = curl_easy_init();
  if (!c->curl_) return {Code::kConnectFailed, "libcurl: cannot create a handle"};
  *out = std::move(c);
  return Status::ok();
}

Status EtcdClient::post_one(const std::string& endpoint, const std::string& path, const std::string& body, long* http,
                            std::string* reply) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  const std::string url = "http://" + endpoint + path;
  reply->clear();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms_);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms_, 500L));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");  // the members are addressed directly
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, reply);
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) return {Code::kConnectFailed, endpoint + ": " + curl_easy_strerror(rc)};
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, http);
  return Status::ok();
}

Status EtcdClient::post(const std::string& path, const std::string& body, std::string* reply) {
  std::lock_guard lock(mutex_);
  std::string failures;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    const std::string& endpoint = endpoints_[current_];
    long http = 0;
    Status st = post_one(endpoint, path, body, &http, reply);
    // A member that is down, or has lost its leader (503), cannot answer: ask the next one.
    if (st.is_ok() && http < 500) {
      if (http == 200) return Status::ok();
      json err;
      if (parse_reply(*reply, &err).is_ok() && err.contains("message")) {
        return {Code::kRefused, "etcd: " + err["message"].get<std::string>()};
      }
      return {Code::kProtocolError, "etcd " + endpoint + " answered HTTP " + std::to_string(http)};
    }
    failures +=
        (failures.empty() ? "" : "; ") + (st.is_ok() ? endpoint + ": HTTP " + std::to_string(http) : st.message());
    current_ = (current_ + 1) % endpoints_.size();
  }
  return {Code::kConnectFailed, "no etcd member answered (" + failures + ")"};
}

Status EtcdClient::range_prefix(const std::string& prefix, std::vector<KeyValue>* out, int64_t* revision) {
  const json req = {{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}};
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/kv/range", req.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  std::vector<KeyValue> kvs;
  for (const auto& e : j.value("kvs", json::array())) {
    KeyValue kv;
    if (!unbase64(e.value("key", ""), &kv.key) || !unbase64(e.value("value", ""), &kv.value)) {
      return {Code::kProtocolError, "etcd sent a key or value that is not base64"};
    }
    kv.create_revision = number(e, "create_revision");
    kv.mod_revision = number(e, "mod_revision");
    kv.version = number(e, "version");
    kv.lease = number(e, "lease");
    kvs.push_back(std::move(kv));
  }
  *revision = number(j.value("header", json::object()), "revision");
  *out = std::move(kvs);
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

Status EtcdClient::txn(const std::vector<Compare>& compares, const std::vector<Op>& success, bool* succeeded) {
  json req = {{"compare", json::array()}, {"success", json::array()}};
  for (const auto& c : compares) req["compare"].push_back(compare_json(c));
  for (const auto& op : success) req["success"].push_back(op_json(op));
  std::string text;
  SLOTSTREAM_RETURN_IF_ERROR(post("/v3/kv/txn", req.dump(), &text));
  json j;
  SLOTSTREAM_RETURN_IF_ERROR(parse_reply(text, &j));
  *succeeded = j.value("succeeded", false);
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
