# `cmake --install build --prefix P`: what a user of an installed slotstream gets.
#
#   P/bin/slotstream                         the CLI (the library linked in: one self-contained binary)
#   P/lib/libslotstream.so.0.1               the library (SONAME libslotstream.so.0.1)
#   P/lib/libslotstream_udp.so               the datagram preload shim (LD_PRELOAD, docs/design.md)
#   P/include/slotstream/*.h                 the public API
#   P/lib/cmake/slotstream/                  find_package(slotstream CONFIG) -> slotstream::slotstream
#   P/lib/pkgconfig/slotstream.pc            pkg-config --cflags --libs slotstream
#   P/share/slotstream/bench/                `slotstream bench`'s orchestrator and plots
#   P/share/slotstream/workers/              example processing workers (docs/workers.md)
#   P/share/slotstream/examples/             hello_stream.cc, the Python and GStreamer examples
#   P/lib/gstreamer-1.0/libgstslotstream.so  the GStreamer plugin (gst/CMakeLists.txt; GST_PLUGIN_PATH)
#   P/share/man/man1/slotstream.1            the man page         } generated from --help
#   P/share/bash-completion/completions/     bash completion      } (tools/gen_cli_docs.py)
#   P/share/zsh/site-functions/_slotstream   zsh completion       }
#   P/lib/systemd/system/slotstream-recv.service   the receiver as a systemd service (ExecStart: P/bin/slotstream)
#   P/share/slotstream/recv.toml             a sample receiver configuration (the unit reads /etc/slotstream/recv.toml)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(slotstream_share ${CMAKE_INSTALL_DATADIR}/slotstream)

# `slotstream bench` looks for its orchestrator here, relative to the binary (tools/bench_peer.cc).
file(RELATIVE_PATH bin_to_bench /P/${CMAKE_INSTALL_BINDIR} /P/${slotstream_share}/bench)
target_compile_definitions(slotstream_cli PRIVATE SLOTSTREAM_BENCH_FROM_BIN="${bin_to_bench}")

install(TARGETS slotstream EXPORT slotstreamTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS slotstream_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/slotstream DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(TARGETS slotstream_udp LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Every module of the orchestrator: an experiment family added in its own file is installed without
# a list to keep in step (an installed `slotstream bench` failed once on a module left out).
install(DIRECTORY bench/ DESTINATION ${slotstream_share}/bench
        FILES_MATCHING PATTERN "*.py" PATTERN "README.md" PATTERN __pycache__ EXCLUDE)
install(PROGRAMS workers/checksum.sh workers/h264.sh DESTINATION ${slotstream_share}/workers)
install(FILES workers/README.md DESTINATION ${slotstream_share}/workers)
install(FILES examples/hello_stream.cc DESTINATION ${slotstream_share}/examples)
install(FILES ${CMAKE_BINARY_DIR}/share/man/man1/slotstream.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_BINARY_DIR}/share/bash-completion/completions/slotstream
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
install(FILES ${CMAKE_BINARY_DIR}/share/zsh/site-functions/_slotstream DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/site-functions)
install(DIRECTORY examples/python DESTINATION ${slotstream_share}/examples PATTERN __pycache__ EXCLUDE)
install(PROGRAMS examples/gstreamer/camera_to_file.sh DESTINATION ${slotstream_share}/examples/gstreamer)

# The CMake package. A static libslotstream would have to export UCX, spdlog and OpenSSL as link
# dependencies; the shared one keeps them inside, which is why only it is installed this way.
install(EXPORT slotstreamTargets NAMESPACE slotstream:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/slotstream)
configure_package_config_file(cmake/slotstreamConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/slotstreamConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/slotstream)
# 0.x: a new minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/slotstreamConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/slotstreamConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/slotstreamConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/slotstream)

file(RELATIVE_PATH PC_PREFIX_FROM_PCDIR /P/${CMAKE_INSTALL_LIBDIR}/pkgconfig /P)
string(REGEX REPLACE "/$" "" PC_PREFIX_FROM_PCDIR "${PC_PREFIX_FROM_PCDIR}")
configure_file(cmake/slotstream.pc.in ${CMAKE_CURRENT_BINARY_DIR}/slotstream.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/slotstream.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The systemd unit and the sample recv.toml name installed paths, so they are written at install time from
# deploy/systemd/*.in with the prefix `cmake --install --prefix P` was given (CMAKE_INSTALL_PREFIX at configure
# time is only its default). systemd reads units from /usr/local/lib/systemd/system as well as /usr/lib/...
set(SLOTSTREAM_SYSTEMD_UNITDIR lib/systemd/system CACHE STRING "where the systemd unit goes, relative to the prefix")
set(deploy_out ${CMAKE_BINARY_DIR}/install-deploy)
install(CODE "
  set(SLOTSTREAM_INSTALL_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(SLOTSTREAM_INSTALL_DATADIR \"\${CMAKE_INSTALL_PREFIX}/${slotstream_share}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/deploy/systemd/slotstream-recv.service.in\"
                 \"${deploy_out}/slotstream-recv.service\" @ONLY)
  configure_file(\"${PROJECT_SOURCE_DIR}/deploy/systemd/recv.toml.in\" \"${deploy_out}/recv.toml\" @ONLY)
")
install(FILES ${deploy_out}/slotstream-recv.service DESTINATION ${SLOTSTREAM_SYSTEMD_UNITDIR})
install(FILES ${deploy_out}/recv.toml DESTINATION ${slotstream_share})
