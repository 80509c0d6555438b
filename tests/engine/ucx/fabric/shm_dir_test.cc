// The directory names of per-process shared memory (src/engine/ucx/fabric/shm_dir.h): only exactly
// "slotstream-<pid>" names a process whose leftovers may be removed.
#include "engine/ucx/fabric/shm_dir.h"

#include <gtest/gtest.h>

namespace slotstream::fabric {
namespace {

TEST(ShmDir, OnlySlotstreamDashPidNamesAnOwner) {
  EXPECT_EQ(segment_dir_owner("slotstream-4242"), 4242);
  EXPECT_EQ(segment_dir_owner("slotstream-1"), 1);
  for (const char* other : {"slotstream-", "slotstream-0", "slotstream--5", "slotstream-12x", "slotstream-1 ",
                            "ucx_shm_posix_1234", "slotstream", "xslotstream-5", "slotstream-99999999999"}) {
    EXPECT_EQ(segment_dir_owner(other), 0) << other;
  }
}

}  // namespace
}  // namespace slotstream::fabric
