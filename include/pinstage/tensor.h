// Host tensors, the allocation strategies that back them, and TaskArgs.
// See docs/tensors.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/export.h"

namespace pinstage {

// The tensor layer sits beside the runtime, not above it: allocators take a Worker by
// reference and include worker.h only in their sources.
class Worker;
class HostFill;

// How an argument travels: IN is uploaded before a run, INOUT is uploaded and read
// back, OUT is only read back.
enum class Direction { in, inout, out };

PINSTAGE_API const char* direction_name(Direction dir);  // "IN", "INOUT", "OUT"
// Parses "IN", "INOUT" or "OUT" (any case); nullopt for anything else.
PINSTAGE_API std::optional<Direction> parse_direction(std::string_view name);

// Contiguous host bytes with an owner token: the one buffer-owner type of the tensor
// layer (data pointer + whatever keeps it alive + how it is released). Shared by the
// tensors that use it; released when the last one lets go.
class PINSTAGE_API Storage {
 public:
  // `owner` keeps `data` alive; dropping the last reference releases it. data may be
  // null only when bytes is 0. `read_only`: memory nothing may write (a map-mode
  // tensor's page cache, mapped PROT_READ); TaskArgs refuses it as an OUT or INOUT.
  Storage(void* data, size_t bytes, bool pinned, std::shared_ptr<void> owner,
          bool read_only = false);
  void* data() const noexcept { return data_; }
  size_t bytes() const noexcept { return bytes_; }
  bool pinned() const noexcept { return pinned_; }
  bool read_only() const noexcept { return read_only_; }

 private:
  void* data_;
  size_t bytes_;
  bool pinned_;
  bool read_only_;
  std::shared_ptr<void> owner_;  // releasing it frees the memory
};

// The one allocation strategy interface. Every fixture and loader takes one, so data is
// written once, in its final place.
class PINSTAGE_API HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // bytes may be 0 (an empty storage with a null data pointer). Contents are
  // unspecified. Throws Error(out_of_memory) when the memory cannot be had.
  virtual std::shared_ptr<Storage> allocate(size_t bytes) = 0;
  // A hint before many allocate() calls of these sizes (a load's tensors): a pool can map
  // them as one segment instead of one at a time. Does nothing by default.
  virtual void reserve(std::span<const size_t> sizes) { (void)sizes; }
  // A writer is about to write [data, data + bytes) of memory allocate() gave (a load's
  // reader threads, each its own range): where reserve() left fresh pages to their writers
  // (the pinned allocator's HostFill), faults them in under the worker's placement.
  // Thread-safe. Does nothing by default.
  virtual void prepare(void* data, size_t bytes) {
    (void)data;
    (void)bytes;
  }
  // Every writer is done: what reserve() left unpinned is pinned now. Nothing by default.
  virtual void finish() {}
  // The writers failed (a load's read error): what reserve() left unpinned is never pinned,
  // and goes back once its storages are released. Nothing by default; never throws.
  virtual void abandon() noexcept {}
  virtual bool pinned() const = 0;
  virtual std::string name() const = 0;  // "pageable" or "pinned"
};

// Page-aligned (4 KiB) pageable memory, each storage rounded up to whole pages. Large
// storages (>= 1 MiB) are fresh anonymous mappings whose pages are not touched at
// allocation, so the first writer (the generator, on all cores) faults them in; the
// memory goes back to the OS when the last tensor lets go.
class PINSTAGE_API PageableAllocator final : public HostAllocator {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes) override;
  bool pinned() const override { return false; }
  std::string name() const override { return "pageable"; }
};

// Pinned host memory from a chip-level worker: one PinnedHostBuffer per storage. The
// allocator must not outlive the worker. If the worker is finalized while tensors still
// hold its storage, the worker reclaims the memory and each storage's later release is
// a no-op (no double free); touching such a tensor's data after finalize is the
// caller's error.
class PINSTAGE_API PinnedAllocator final : public HostAllocator {
 public:
  // Throws Error(invalid_argument) unless `worker` is an initialized chip-level worker
  // (the shared require_chip_worker() guard).
  explicit PinnedAllocator(Worker& worker);
  std::shared_ptr<Storage> allocate(size_t bytes) override;
  // Worker::reserve_host_fill of the sizes' whole pages: a first load's fresh segment is
  // faulted by its writers (prepare) and pinned behind them (finish).
  void reserve(std::span<const size_t> sizes) override;
  void prepare(void* data, size_t bytes) override;
  void finish() override;
  void abandon() noexcept override;
  // The last reserve()'s fill (its fault and pin seconds, the pages it took); nullptr
  // before any reserve().
  const HostFill* fill() const noexcept { return fill_.get(); }
  bool pinned() const override { return true; }
  std::string name() const override { return "pinned"; }
  ~PinnedAllocator() override;
  PinnedAllocator(const PinnedAllocator&) = delete;
  PinnedAllocator& operator=(const PinnedAllocator&) = delete;

 private:
  Worker* worker_;
  std::unique_ptr<HostFill> fill_;
};

// Element count of a shape; throws Error(invalid_argument) for a negative dimension or
// a product past INT64_MAX.
PINSTAGE_API uint64_t checked_numel(const std::vector<int64_t>& shape);
// numel * dtype_size, checked the same way.
PINSTAGE_API uint64_t checked_nbytes(const std::vector<int64_t>& shape, DType dtype);

// A named, typed, shaped view of a whole contiguous storage, with its direction.
class PINSTAGE_API Tensor {
 public:
  // Throws Error(invalid_argument) for an empty name, a bad shape (see checked_nbytes),
  // a missing storage or one smaller than the tensor's bytes.
  Tensor(std::string name, DType dtype, std::vector<int64_t> shape, Direction dir,
         std::shared_ptr<Storage> storage);
  // Allocates a fresh storage of the right size from `allocator` (contents unspecified).
  // The shape is checked before anything is allocated.
  static Tensor empty(std::string name, DType dtype, std::vector<int64_t> shape, Direction dir,
                      HostAllocator& allocator);

  const std::string& name() const noexcept { return name_; }
  DType dtype() const noexcept { return dtype_; }
  const std::vector<int64_t>& shape() const noexcept { return shape_; }
  Direction direction() const noexcept { return dir_; }
  uint64_t numel() const noexcept { return numel_; }
  uint64_t nbytes() const noexcept { return nbytes_; }
  bool pinned() const noexcept { return storage_->pinned(); }
  void* data() const noexcept { return storage_->data(); }
  template <typename T>
  T* data_as() const noexcept {
    return static_cast<T*>(storage_->data());
  }
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  std::string shape_string() const;  // "[16, 5120]"

 private:
  std::string name_;
  DType dtype_;
  std::vector<int64_t> shape_;
  Direction dir_;
  uint64_t numel_;
  uint64_t nbytes_;
  std::shared_ptr<Storage> storage_;
};

// The ordered, named arguments of one task.
class PINSTAGE_API TaskArgs {
 public:
  // Appends; throws Error(invalid_argument) on a duplicate name, and ReadOnlyError for
  // an OUT or INOUT tensor whose storage is read-only (a run would write it back).
  void add(Tensor tensor);
  size_t size() const noexcept { return tensors_.size(); }
  bool empty() const noexcept { return tensors_.empty(); }
  // Throws Error(invalid_argument) when index >= size().
  const Tensor& at(size_t index) const;
  // Throws Error(not_found) naming the missing tensor.
  const Tensor& get(std::string_view name) const;
  const Tensor* find(std::string_view name) const noexcept;
  auto begin() const noexcept { return tensors_.begin(); }
  auto end() const noexcept { return tensors_.end(); }

  uint64_t total_bytes() const noexcept;  // all tensors
  uint64_t input_bytes() const noexcept;  // IN + INOUT
  size_t input_count() const noexcept;
  // "20 tensors, 19 inputs, 40,859,999,040 bytes" (bytes = input bytes).
  std::string summary() const;

 private:
  std::vector<Tensor> tensors_;
};

// 40859999040 -> "40,859,999,040".
PINSTAGE_API std::string format_thousands(uint64_t value);
// Human units, decimal like link rates (GB/s): 40859999040 -> "40.86 GB", 4096 -> "4.10 kB",
// 17 -> "17 B". Reports print these; JSON keeps exact bytes.
PINSTAGE_API std::string format_bytes(uint64_t bytes);
// {16, 5120} -> "[16, 5120]".
PINSTAGE_API std::string format_shape(const std::vector<int64_t>& shape);

}  // namespace pinstage
