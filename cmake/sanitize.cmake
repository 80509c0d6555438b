# Sanitizer and fuzzing builds, each in a build directory of its own (never build/):
#   -DSLOTSTREAM_SANITIZE=thread    ThreadSanitizer         (scripts/sanitize.sh thread  -> build-tsan/)
#   -DSLOTSTREAM_SANITIZE=address   AddressSanitizer + UBSan (scripts/sanitize.sh address -> build-asan/)
#   -DSLOTSTREAM_FUZZ=ON            libFuzzer targets in fuzz/, clang only, everything instrumented
#                                   for coverage + ASan + UBSan   (fuzz/run.sh -> build-fuzz/)
# Only slotstream's own code is instrumented: UCX, spdlog and the C++ runtime come from Debian as
# they are (see scripts/tsan.supp for what that means under ThreadSanitizer).
set(SLOTSTREAM_SANITIZE "" CACHE STRING "Sanitizer build: thread, or address (AddressSanitizer + UndefinedBehaviorSanitizer)")
set_property(CACHE SLOTSTREAM_SANITIZE PROPERTY STRINGS "" thread address)
option(SLOTSTREAM_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang; implies address + undefined)" OFF)

# UB is an error, not a log line: the first report aborts the test or the fuzz run.
set(slotstream_ubsan -fsanitize=undefined -fno-sanitize-recover=undefined)
if(SLOTSTREAM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SLOTSTREAM_FUZZ needs clang (libFuzzer): configure with CXX=clang++ (fuzz/run.sh does)")
  endif()
  if(SLOTSTREAM_SANITIZE)
    message(FATAL_ERROR "SLOTSTREAM_FUZZ already builds with address + undefined; leave SLOTSTREAM_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address ${slotstream_ubsan} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address ${slotstream_ubsan})
elseif(SLOTSTREAM_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(SLOTSTREAM_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address ${slotstream_ubsan} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address ${slotstream_ubsan})
elseif(SLOTSTREAM_SANITIZE)
  message(FATAL_ERROR "SLOTSTREAM_SANITIZE must be thread or address, not '${SLOTSTREAM_SANITIZE}'")
endif()
