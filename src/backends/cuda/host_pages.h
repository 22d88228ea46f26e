// Anonymous host memory mapped and pre-faulted from several threads: the first half of
// register-mode pinning (see Note [Two pinned modes] in cuda_backend.cpp). No CUDA
// here, so the tests run on machines without a GPU.
#pragma once

#include <cstddef>
#include <string>

namespace pinstage::cuda {

struct HostPagesOptions {
  int threads = 0;          // 0 = one per online core, at most 32
  bool huge_pages = false;  // align to 2 MiB and ask for transparent huge pages
};

// One mapping. `data` is what the caller uses; `base`/`map_bytes` is what munmap needs.
struct MappedPages {
  void* base = nullptr;
  size_t map_bytes = 0;
  void* data = nullptr;
  size_t bytes = 0;  // usable bytes at data (the request rounded up to whole pages)
};

// Where the time went, for the pinning report.
struct PrefaultReport {
  double map_seconds = 0;
  double prefault_seconds = 0;
  int threads = 0;
  bool populate_write = false;  // madvise(MADV_POPULATE_WRITE) did the faulting
};

enum class PagesStatus { ok, out_of_memory, failed };

// Maps `bytes` (> 0) of private anonymous memory and writes every page once, split across
// threads, so the later page-locking finds resident pages. On failure nothing stays
// mapped and `error` says why.
PagesStatus map_prefaulted(size_t bytes, const HostPagesOptions& options, MappedPages& out,
                           PrefaultReport& report, std::string& error);

// Undoes map_prefaulted; returns false (with `error`) when munmap refuses.
bool unmap_pages(const MappedPages& pages, std::string& error);

// Threads map_prefaulted uses for `bytes` under `options` (at least 1, at most one per
// 32 MiB so small buffers do not pay for thread start-up).
int prefault_thread_count(size_t bytes, const HostPagesOptions& options);

}  // namespace pinstage::cuda
