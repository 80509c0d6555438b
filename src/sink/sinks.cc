// The public sinks (include/slotstream/sinks.h): DirSink, with retention when asked, and NullSink.
#include "slotstream/sinks.h"

#include "sink/dir_sink.h"
#include "sink/null_sink.h"
#include "sink/retention.h"

namespace slotstream {

std::unique_ptr<MessageSink> make_directory_sink(DirectorySinkOptions options) {
  auto dir = std::make_unique<sink::DirSink>(options.dir, std::move(options.first));
  if (options.keep == 0) return dir;
  return sink::keep_newest(std::move(dir), std::move(options.dir), options.keep);
}

std::unique_ptr<MessageSink> make_null_sink() { return std::make_unique<sink::NullSink>(); }

}  // namespace slotstream
