// FUZZ_CHECK: an invariant of the code under test. A violation prints what broke and aborts, so
// that libFuzzer records the input as a crash (fuzz/README.md: reproducing a finding).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
