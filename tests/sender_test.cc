// The library's own answer to `transport rdma` on a host without a usable RDMA device
// (src/sender.cc, src/receiver.cc): a kInvalidArgument naming what is missing and what to do,
// before anything connects or listens — what the CLI turns into exit status 2 and Python into
// slotstream.InvalidArgument.
#include <gtest/gtest.h>

#include <chrono>

#include "fabric/transports.h"
#include "slotstream/slotstream.h"

namespace slotstream {
namespace {

bool host_has_rdma() { return fabric::host_rdma({Transport::kRdma, RdmaTransport::kRc}).usable; }

TEST(RdmaWithoutADevice, SenderConnectSaysWhatIsMissingBeforeConnecting) {
  if (host_has_rdma()) GTEST_SKIP() << "this host has an RDMA device";
  SenderOptions o;
  o.host = "127.0.0.1";
  o.port = 1;  // nothing listens: the answer must come before any connection
  o.name = "lib";
  o.devices = {0};
  o.transport = Transport::kRdma;
  std::unique_ptr<Sender> sender;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = Sender::connect(o, &sender);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("transport rdma: no RDMA device", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("use --transport tcp"), std::string::npos) << st.message();
  EXPECT_EQ(sender, nullptr);
  // auto does not offer it and is not refused for it (here: no receiver, so it cannot connect).
  o.transport = Transport::kAuto;
  EXPECT_EQ(Sender::connect(o, &sender).code(), Code::kConnectFailed);
}

TEST(RdmaWithoutADevice, ReceiverStartSaysWhatIsMissing) {
  if (host_has_rdma()) GTEST_SKIP() << "this host has an RDMA device";
  ReceiverOptions o;
  o.host = "127.0.0.1";
  o.transport = Transport::kRdma;
  o.make_sink = [](const SenderInfo&, std::unique_ptr<MessageSink>*) { return Status::ok(); };
  std::unique_ptr<Receiver> rx;
  Status st = Receiver::start(o, &rx);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("transport rdma: no RDMA device", 0), 0u) << st.message();
  EXPECT_EQ(rx, nullptr);
  // auto starts without it.
  o.transport = Transport::kAuto;
  ASSERT_TRUE(Receiver::start(o, &rx).is_ok());
  rx->stop();
}

}  // namespace
}  // namespace slotstream
