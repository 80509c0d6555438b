// A receiver and a sender half of one protocol in one process, over real UCX on one transport,
// wired the way src/engine/ucx/receiver.cc and src/engine/ucx/session/sender_lane.cc wire them (two contexts, the
// receiver's shared worker with its progress thread, an endpoint each way), so that a test can
// drive transmit_st, poll and release itself and look at both halves' counters.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../fabric/connect.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/protocol/protocol.h"
#include "slotstream/slotstream.h"

namespace slotstream::testing_support {

struct FabricPair {
  std::unique_ptr<fabric::Context> rx_context, tx_context;
  std::unique_ptr<fabric::Worker> rx_worker, tx_worker;
  std::unique_ptr<fabric::ProgressThread> progress;
  std::unique_ptr<fabric::Endpoint> tx_endpoint, rx_endpoint;
  std::unique_ptr<protocol::SenderFabric> sender_fabric;
  std::unique_ptr<protocol::ReceiverProtocol> rx;  // destroyed before the fabric above
  std::unique_ptr<protocol::SenderProtocol> tx;
  std::atomic<bool> stop{false};  // makes the sender's waits give up (its liveness check fails)

  ~FabricPair() {
    tx.reset();
    rx.reset();
    rx_endpoint.reset();
    tx_endpoint.reset();
    progress.reset();
  }

  // Sets up `protocol` with `options` for `geometry`; the receiver half only if !with_sender.
  Status open(Transport wire, const std::string& protocol, const std::string& options, protocol::Geometry geometry,
              bool with_sender = true) {
    const protocol::Descriptor* d = protocol::find(protocol);
    if (!d) return {Code::kInvalidArgument, "no protocol " + protocol};
    protocol::Options opts;
    SLOTSTREAM_RETURN_IF_ERROR(protocol::Options::parse(options, &opts));
    SLOTSTREAM_RETURN_IF_ERROR(protocol::check_options(*d, opts));
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(wire, &rx_context));
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(wire, &tx_context));
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(*rx_context, true, true, &rx_worker));
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(*tx_context, false, false, &tx_worker));
    progress = std::make_unique<fabric::ProgressThread>(*rx_worker);
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Endpoint::create(*tx_worker, rx_worker->address(), "127.0.0.1", &tx_endpoint));
    protocol::ReceiverFabric rf{*rx_context, *rx_worker, geometry};
    SLOTSTREAM_RETURN_IF_ERROR(d->make_receiver(rf, opts, &rx));
    if (!with_sender) return Status::ok();
    sender_fabric.reset(new protocol::SenderFabric{*tx_context, *tx_worker, *tx_endpoint, geometry, [this] {
                                                     return stop.load() ? Status(Code::kCancelled, "test stopped")
                                                                        : Status::ok();
                                                   }});
    SLOTSTREAM_RETURN_IF_ERROR(d->make_sender(*sender_fabric, rx->setup(), opts, &tx));
    if (d->receiver_endpoint) {
      SLOTSTREAM_RETURN_IF_ERROR(fabric::connect_pair(*rx_worker, *tx_worker, &rx_endpoint));
    }
    return rx->connect({rx_endpoint.get(), tx->setup()});
  }
};

// `count` records of random length (16..block size) and content.
inline std::vector<std::vector<std::byte>> random_records(size_t count, uint32_t block_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::byte>> out(count);
  for (auto& r : out) {
    r.resize(16 + rng() % (block_size - 15));
    for (auto& b : r) b = std::byte(rng());
  }
  return out;
}

// What the consumer saw while `stream` ran.
struct Observed {
  size_t records = 0;  // received byte-exact and in order
  uint64_t max_unreleased_bytes = 0;
  std::string error;  // the first mismatch, if any
};

// Transmits `records` from a sender thread while this thread consumes: progress, poll, check
// each new record against the next expected one, `before_release(i)`, release. Fails the test on
// a transmit error; stops after `timeout`.
inline Observed stream(FabricPair& p, const std::vector<std::vector<std::byte>>& records,
                       const std::function<void(size_t)>& before_release = {},
                       std::chrono::seconds timeout = std::chrono::seconds(30)) {
  Status sent;
  std::thread sender([&] {
    std::deque<fabric::Request> pending;  // each record has its own buffer: no reuse to wait for
    for (const auto& r : records) {
      fabric::Request req;
      sent = p.tx->transmit_st(r.data(), r.size(), &req);
      if (!sent.is_ok()) return;
      if (req.pending()) pending.push_back(std::move(req));
      while (!pending.empty() && pending.front().check().code() != Code::kInProgress) pending.pop_front();
    }
    for (auto& req : pending) {
      sent = req.wait(*p.tx_worker, [] { return Status::ok(); });
      if (!sent.is_ok()) return;
    }
    sent = p.tx->finish_st();
  });
  Observed o;
  std::vector<protocol::Record> polled;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (o.records < records.size() && o.error.empty() && std::chrono::steady_clock::now() < deadline) {
    p.rx->progress();
    polled.clear();
    p.rx->poll(&polled);
    uint64_t unreleased = 0;
    for (const auto& r : polled) unreleased += r.bytes.size();
    o.max_unreleased_bytes = std::max(o.max_unreleased_bytes, unreleased);
    for (const auto& r : polled) {
      const auto& want = records[o.records];
      if (r.bytes.size() != want.size() || !std::equal(want.begin(), want.end(), r.bytes.begin())) {
        o.error = "record " + std::to_string(o.records) + " differs (" + std::to_string(r.bytes.size()) +
                  " bytes, want " + std::to_string(want.size()) + ")";
        break;
      }
      if (before_release) before_release(o.records);
      p.rx->release(r.id);
      ++o.records;
    }
  }
  // Let the sender's finish see the last updates (carc waits until everything was processed).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end && sender.joinable()) {
    p.rx->progress();
    if (o.records == records.size()) {
      sender.join();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (sender.joinable()) {
    ADD_FAILURE() << "the sender did not finish; consumer got " << o.records << " of " << records.size();
    p.stop = true;
    sender.join();
  } else {
    EXPECT_TRUE(sent.is_ok()) << sent.to_string();
  }
  return o;
}

inline std::string wire_case_name(const ::testing::TestParamInfo<Transport>& info) {
  return transport_name(info.param);
}

}  // namespace slotstream::testing_support
