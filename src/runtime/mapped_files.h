// mapped_files.h: a file qshard maps (token files, safetensors) that shrinks while it is read.
//
// What: reading a page of a memory-mapped file past its current end raises SIGBUS, which would end
// the process by a signal with no word of which file. Every mapping of an input file is registered
// (register_mapping at mmap, unregister_mapping before munmap); install_sigbus_report() (main())
// installs a SIGBUS handler that, for a fault inside a registered mapping, writes
// "qshard: error: PATH: the file shrank while it was being read (...)" to stderr and ends the
// process with exit code 2 (bad input: the file changed under the job). A fault anywhere else is
// passed on to the previous handler / the default action.
// Limits: kMaxMappings mappings at once (more are simply not named); paths cut to 511 bytes.
// Thread safety: register / unregister from any thread (a spin lock); the handler only reads.
#pragma once

#include <cstddef>
#include <string>

namespace qshard {

inline constexpr int kMaxMappings = 256;

void register_mapping(const void* base, size_t length, const std::string& path);
void unregister_mapping(const void* base);
void install_sigbus_report();

}  // namespace qshard
