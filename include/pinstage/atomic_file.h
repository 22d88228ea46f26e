// The one way pinstage writes a file: into a temporary file in the target's directory,
// fsync, then rename over the target. A failure at any point leaves the target as it
// was; a target that exists and is not a regular file (a device, a directory, a FIFO)
// is refused before any work. A symbolic link is followed: the file it points to is
// replaced atomically and the link stays a link. See docs/cli.md ("Files pinstage writes").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "pinstage/export.h"

namespace pinstage {

// Throws Error(io) naming `path` when it cannot be written atomically: empty, an
// existing non-regular file, or a directory that does not exist. Commands call it before
// they start long work, so that a bad --out fails in milliseconds, not after the run.
PINSTAGE_API void check_output_path(const std::string& path);

// A file being written. Nothing is visible at `path` until commit(); destroying an
// uncommitted AtomicFile removes the temporary file and leaves the target untouched.
class PINSTAGE_API AtomicFile {
 public:
  // Checks `path` (as check_output_path) and creates the temporary file next to it.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws Error(io) naming the target and the reason (e.g. ENOSPC).
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Writes `bytes` at `offset` of the temporary file (for parallel writers).
  void write_at(uint64_t offset, const void* data, size_t bytes);
  // The temporary file's descriptor, for callers that write in parallel with pwrite.
  int fd() const noexcept { return fd_; }
  // fsync, then rename over the target (and fsync its directory). Throws Error(io);
  // after a failure the target is unchanged.
  void commit();
  // The file written: the given path with every symbolic link followed.
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  int temp_slot_ = -1;  // its entry in the table remove_temporary_files_on_signals() reads
  int fd_ = -1;
  bool committed_ = false;
};

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove the temporary file of
// every AtomicFile not yet committed (the targets stay as they were), then end the
// process with the signal's default action. For programs (the CLI calls it first);
// a library caller keeps its own handlers. Up to 64 files at once are tracked.
PINSTAGE_API void remove_temporary_files_on_signals();

// Writes `text` to `path` atomically (AtomicFile, one write, commit).
PINSTAGE_API void write_file_atomically(const std::string& path, std::string_view text);

// Test seam (issue 41): every fsync the writer makes, the temporary file's before the
// rename and the directory's after it, goes through `fn` when set (nullptr: ::fsync);
// returns the one set before. A test counts the calls or fails one. Not for programs.
using FsyncFunction = int (*)(int fd);
PINSTAGE_API FsyncFunction set_atomic_file_fsync_for_tests(FsyncFunction fn) noexcept;

}  // namespace pinstage
