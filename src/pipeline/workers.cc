// DirectoryWorkers (include/slotstream/workers.h): the public face of the WorkerManager.
#include "slotstream/workers.h"

#include "pipeline/worker_manager.h"

namespace slotstream {

struct DirectoryWorkers::Impl {
  explicit Impl(DirectoryWorkersOptions options) : manager(std::move(options)) {}
  pipeline::WorkerManager manager;
};

DirectoryWorkers::DirectoryWorkers(DirectoryWorkersOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

DirectoryWorkers::~DirectoryWorkers() = default;

std::unique_ptr<MessageSink> DirectoryWorkers::make_sink(std::filesystem::path sender_dir, std::string sender,
                                                         std::map<uint16_t, uint64_t> first) {
  return pipeline::make_pipeline_sink(std::move(sender_dir), std::move(sender), impl_->manager, std::move(first));
}

std::vector<DirectoryWorkerStats> DirectoryWorkers::stats() const { return impl_->manager.stats(); }

uint64_t DirectoryWorkers::total_backlog_bytes() const { return impl_->manager.total_backlog_bytes(); }

void DirectoryWorkers::stop() { impl_->manager.stop(); }

}  // namespace slotstream
