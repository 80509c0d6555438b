// `recv --keep N`: at most the N newest messages per device stay on disk; as a message is stored,
// the one N before it is removed. Bounded disk for a receiver that nobody empties (12 cameras of
// 640x480x3 at 25 fps write 16.6 GB a minute). With workers the manager does the same, but never
// removes a message its worker has not finished (src/pipeline/worker_manager.h, WorkerOptions::keep).
// Public as DirectorySinkOptions::keep (slotstream/sinks.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "sink/dir_sink.h"

namespace slotstream::sink {

// `inner` (a sender's DirSink, storing into `sender_dir`) with the oldest messages of each device
// removed beyond the newest `keep` (> 0). The same threading as a MessageSink.
std::unique_ptr<MessageSink> keep_newest(std::unique_ptr<DirSink> inner, std::filesystem::path sender_dir,
                                         uint64_t keep);

}  // namespace slotstream::sink
