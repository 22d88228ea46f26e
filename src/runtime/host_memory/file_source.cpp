// The `file` segment source (Note [Segment sources] in host_memory.cpp): a file's page
// cache mapped read-only and pinned in place through the backend's host_register slot
// (ABI v7). Nothing is read into memory of our own and nothing is copied: a warm file
// costs the page-table work of the lock, not a pass over its bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "pinstage/clock.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "runtime/worker_state.h"

namespace pinstage {

namespace {

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "cannot map '" + path + "' read-only: " + what);
}

// Unpins through the worker while it lives: every stream is synchronized first (a queued
// copy may still read the range; this is rare, a mapping's last owner going away).
void unregister(runtime::WorkerState& s, void* data, size_t bytes) noexcept {
  runtime::CallGuard guard(s);
  if (!guard.entered()) return;  // finalize unpinned it already
  std::vector<ps_allocation> streams;
  {
    std::lock_guard lock(s.mu);
    if (!s.table.erase(runtime::EntryKind::registered_host, data)) return;
    streams = s.table.snapshot(runtime::EntryKind::stream);
  }
  if (s.api().stream_sync != nullptr)
    for (const ps_allocation& st : streams)
      (void)s.api().stream_sync(s.ctx,
                                static_cast<ps_stream*>(st.ptr));  // failures: their waiter's
  const int status = s.api().host_unregister(s.ctx, data, bytes);
  if (status == PS_OK) return;
  log(LogLevel::error, s.name() + ": unpinning a file mapping failed: " + ps_status_str(status) +
                           " " + s.api().last_error() + " (kept for finalize)");
  std::lock_guard lock(s.mu);
  s.table.add_failed(runtime::EntryKind::registered_host, ps_allocation{data, bytes, nullptr});
  ++s.free_failures;
}

}  // namespace

PinnedFileMapping::~PinnedFileMapping() {
  if (data_ == nullptr) return;
  if (pinned_)
    if (const std::shared_ptr<runtime::WorkerState> s = owner_.lock())
      unregister(*s, data_, map_bytes_);
  if (munmap(data_, map_bytes_) != 0)
    log(LogLevel::error, std::string("unmapping a file mapping failed: ") + std::strerror(errno));
}

namespace {

// The pinning half: the verdict of the pin budget is made once, here, and acted on.
void pin(runtime::WorkerState& s, void* data, size_t bytes, bool& pinned, std::string& refusal) {
  if (s.api().host_register == nullptr) {
    refusal = "the " + s.name() + " backend has no host_register slot";
    return;
  }
  size_t want = bytes;
  const std::string over = s.pin_verdict(want, bytes, bytes);  // the one verdict, once
  if (!over.empty()) {
    if (setting_choice(Setting::pin_policy).value_or("strict") != "fallback")
      throw Error(ErrorCode::out_of_memory, s.name() + ": mapping a file: " + over);
    refusal = over.substr(0, over.find(". "));
    return;
  }
  const int status = s.api().host_register(s.ctx, data, bytes, PS_REGISTER_READ_ONLY);
  if (status == PS_ERR_UNSUPPORTED) {
    refusal = s.name() + " cannot pin a read-only file mapping: " + s.api().last_error();
    return;
  }
  s.check(status, "host_register of a read-only file mapping");
  std::lock_guard lock(s.mu);
  if (!s.table.insert(runtime::EntryKind::registered_host, ps_allocation{data, bytes, nullptr})) {
    (void)s.api().host_unregister(s.ctx, data, bytes);
    throw Error(ErrorCode::internal, "a file mapping was registered at an address in use");
  }
  pinned = true;
}

}  // namespace

std::shared_ptr<PinnedFileMapping> Worker::map_file_pinned(const std::string& path,
                                                           uint64_t expect_bytes) {
  const runtime::CallGuard guard = enter();
  const Stopwatch map_watch;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error(path, std::strerror(errno));
  struct stat st {};
  const int stat_status = ::fstat(fd, &st);
  const int stat_errno = errno;
  if (stat_status != 0) {
    ::close(fd);
    io_error(path, std::strerror(stat_errno));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  const runtime::FileKey key{st.st_dev, st.st_ino, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, size};
  {  // the file mapped already (another tensor of it): one mapping, pinned once
    std::lock_guard lock(state_->mu);
    auto it = state_->mapped_files.find(key);
    if (it != state_->mapped_files.end()) {
      if (std::shared_ptr<PinnedFileMapping> live = it->second.lock()) {
        ::close(fd);
        return live;
      }
      state_->mapped_files.erase(it);
    }
  }
  if (expect_bytes != UINT64_MAX && size != expect_bytes) {
    ::close(fd);
    io_error(path, "the file has " + std::to_string(size) + " bytes, " +
                       std::to_string(expect_bytes) +
                       " when it was opened: it changed since; open it again");
  }
  if (size == 0) {
    ::close(fd);
    io_error(path, "the file is empty");
  }
  const size_t map_bytes = round_up_to_pages(static_cast<size_t>(size));
  void* data = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file (and its inode) alive
  if (data == MAP_FAILED) io_error(path, std::string("mmap: ") + std::strerror(map_errno));
  std::shared_ptr<PinnedFileMapping> m(new PinnedFileMapping());
  m->owner_ = state_;
  m->data_ = static_cast<unsigned char*>(data);
  m->size_ = size;
  m->map_bytes_ = map_bytes;
  m->map_seconds_ = map_watch.seconds();
  const Stopwatch pin_watch;
  pin(*state_, data, map_bytes, m->pinned_, m->refusal_);  // m unmaps on a throw
  m->pin_seconds_ = pin_watch.seconds();
  std::lock_guard lock(state_->mu);
  state_->mapped_files[key] = m;  // a race maps the file twice: both work, the last is shared
  return m;
}

}  // namespace pinstage
