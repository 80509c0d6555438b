#include "engine/ucx/protocol/ucx_raw_put.h"

#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

class RawPutSender final : public SenderProtocol {
 public:
  RawPutSender(SenderFabric& fabric, uint64_t blocks_addr, std::unique_ptr<fabric::RemoteKey> rkey)
      : fabric_(fabric),
        blocks_addr_(blocks_addr),
        rkey_(std::move(rkey)) {}

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    const auto& g = fabric_.geometry;
    uint64_t dst = blocks_addr_ + (stats_.records % g.blocks) * uint64_t(g.block_size);
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.put(src, length, dst, *rkey_, data_req));
    if (++stats_.records % kRawPutFlushEvery == 0) return fabric_.endpoint.flush(fabric_.alive);
    return Status::ok();
  }
  Status finish_st() override { return fabric_.endpoint.flush(fabric_.alive); }
  ProtocolStats stats() const override { return stats_; }

 private:
  SenderFabric& fabric_;
  uint64_t blocks_addr_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  ProtocolStats stats_;
};

class RawPutReceiver final : public ReceiverProtocol {
 public:
  RawPutReceiver(std::unique_ptr<fabric::MemoryRegion> region, std::vector<uint8_t> rkey)
      : region_(std::move(region)),
        rkey_(std::move(rkey)) {}
  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(region_->remote_address());
    w.blob32(rkey_);
    return std::move(w.buffer());
  }
  void poll(std::vector<Record>*) override {}  // nothing is ever announced
  void release(uint64_t) override {}
  uint64_t max_records() const override { return 1; }

 private:
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<uint8_t> rkey_;
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options&,
                   std::unique_ptr<SenderProtocol>* out) {
  uint64_t addr[1];
  std::unique_ptr<fabric::RemoteKey> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(read_keyed_setup(setup, "ucx_raw_put", fabric.endpoint, addr, &rkey));
  out->reset(new RawPutSender(fabric, addr[0], std::move(rkey)));
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options&, std::unique_ptr<ReceiverProtocol>* out) {
  const Geometry& g = fabric.geometry;
  fabric::ExposedRegion region;
  SLOTSTREAM_RETURN_IF_ERROR(
      fabric::MemoryRegion::allocate_exposed(fabric.context, size_t(g.blocks) * g.block_size, &region));
  out->reset(new RawPutReceiver(std::move(region.region), std::move(region.rkey)));
  return Status::ok();
}

}  // namespace

const Descriptor kUcxRawPut = {
    .name = "ucx_raw_put",
    .summary =
        "benchmark reference: raw puts rotating over the receiver's blocks, no flow control, "
        "nothing delivered",
    .reference = true,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
