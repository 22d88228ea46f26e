// Storage, Tensor, checked shape arithmetic, TaskArgs.
#include "pinstage/tensor.h"

#include <cstdio>
#include <iterator>
#include <limits>

#include "pinstage/error.h"
#include "pinstage/names.h"

namespace pinstage {

namespace {
constexpr const char* kDirectionNames[] = {"IN", "INOUT", "OUT"};  // Direction order
}  // namespace

const char* direction_name(Direction dir) { return enum_name(dir, kDirectionNames); }

std::optional<Direction> parse_direction(std::string_view name) {
  std::string upper(name);
  for (char& c : upper)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return enum_from_name<Direction>(upper, kDirectionNames);
}

Storage::Storage(void* data, size_t bytes, bool pinned, std::shared_ptr<void> owner, bool read_only)
    : data_(data), bytes_(bytes), pinned_(pinned), read_only_(read_only), owner_(std::move(owner)) {
  if (data_ == nullptr && bytes_ != 0)
    throw Error(ErrorCode::invalid_argument,
                "Storage: null data with " + std::to_string(bytes_) + " bytes");
}

namespace {

constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

}  // namespace

uint64_t checked_numel(const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw Error(ErrorCode::invalid_argument, "shape " + format_shape(shape) + ": dimension " +
                                                   std::to_string(i) +
                                                   " is negative; dimensions must be >= 0");
  }
  for (int64_t dim : shape) {
    if (dim == 0) return 0;  // an empty tensor, whatever the other dimensions
  }
  for (int64_t dim : shape) {
    uint64_t next;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &next) || next > kMaxCount)
      throw Error(ErrorCode::invalid_argument,
                  "shape " + format_shape(shape) +
                      ": the element count overflows a 64-bit size; use smaller dimensions");
    numel = next;
  }
  return numel;
}

uint64_t checked_nbytes(const std::vector<int64_t>& shape, DType dtype) {
  const uint64_t numel = checked_numel(shape);
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &bytes) ||
      bytes > kMaxCount)
    throw Error(ErrorCode::invalid_argument, "shape " + format_shape(shape) + " of " +
                                                 dtype_name(dtype) +
                                                 ": the byte size overflows a 64-bit size; use "
                                                 "smaller dimensions");
  return bytes;
}

Tensor::Tensor(std::string name, DType dtype, std::vector<int64_t> shape, Direction dir,
               std::shared_ptr<Storage> storage)
    : name_(std::move(name)),
      dtype_(dtype),
      shape_(std::move(shape)),
      dir_(dir),
      numel_(checked_numel(shape_)),
      nbytes_(checked_nbytes(shape_, dtype_)),
      storage_(std::move(storage)) {
  if (name_.empty()) throw Error(ErrorCode::invalid_argument, "Tensor: the name is empty");
  if (!storage_)
    throw Error(ErrorCode::invalid_argument, "Tensor '" + name_ + "': no storage given");
  if (storage_->bytes() < nbytes_)
    throw Error(ErrorCode::invalid_argument,
                "Tensor '" + name_ + "': " + dtype_name(dtype_) + " " + format_shape(shape_) +
                    " needs " + std::to_string(nbytes_) + " bytes but its storage has " +
                    std::to_string(storage_->bytes()));
}

Tensor Tensor::empty(std::string name, DType dtype, std::vector<int64_t> shape, Direction dir,
                     HostAllocator& allocator) {
  if (name.empty()) throw Error(ErrorCode::invalid_argument, "Tensor: the name is empty");
  const uint64_t bytes = checked_nbytes(shape, dtype);
  if (bytes > std::numeric_limits<size_t>::max())
    throw Error(ErrorCode::invalid_argument, "Tensor '" + name + "': too large for this host");
  auto storage = allocator.allocate(static_cast<size_t>(bytes));
  return Tensor(std::move(name), dtype, std::move(shape), dir, std::move(storage));
}

std::string Tensor::shape_string() const { return format_shape(shape_); }

void TaskArgs::add(Tensor tensor) {
  if (find(tensor.name()) != nullptr)
    throw Error(ErrorCode::invalid_argument, "TaskArgs: a tensor named '" + tensor.name() +
                                                 "' is already there; names must be unique");
  if (tensor.direction() != Direction::in && tensor.storage()->read_only())
    throw ReadOnlyError("TaskArgs: tensor '" + tensor.name() + "' is read-only memory (a " +
                        "map-mode load's view of the page cache), and as " +
                        direction_name(tensor.direction()) +
                        " a run would write it; pass a writable copy (clone() in Python, or "
                        "load with mode 'copy'), or add it as IN");
  tensors_.push_back(std::move(tensor));
}

const Tensor& TaskArgs::at(size_t index) const {
  if (index >= tensors_.size())
    throw Error(ErrorCode::invalid_argument, "TaskArgs: index " + std::to_string(index) +
                                                 " is out of range (" +
                                                 std::to_string(tensors_.size()) + " tensors)");
  return tensors_[index];
}

const Tensor& TaskArgs::get(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  throw Error(ErrorCode::not_found, "TaskArgs: no tensor named '" + std::string(name) + "' (" +
                                        std::to_string(tensors_.size()) + " tensors)");
}

const Tensor* TaskArgs::find(std::string_view name) const noexcept {
  for (const Tensor& t : tensors_)
    if (t.name() == name) return &t;
  return nullptr;
}

uint64_t TaskArgs::total_bytes() const noexcept {
  uint64_t total = 0;
  for (const Tensor& t : tensors_) total += t.nbytes();
  return total;
}

uint64_t TaskArgs::input_bytes() const noexcept {
  uint64_t total = 0;
  for (const Tensor& t : tensors_)
    if (t.direction() != Direction::out) total += t.nbytes();
  return total;
}

size_t TaskArgs::input_count() const noexcept {
  size_t count = 0;
  for (const Tensor& t : tensors_)
    if (t.direction() != Direction::out) ++count;
  return count;
}

std::string TaskArgs::summary() const {
  return std::to_string(size()) + (size() == 1 ? " tensor, " : " tensors, ") +
         std::to_string(input_count()) + " inputs, " + format_thousands(input_bytes()) + " bytes";
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string format_thousands(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  const size_t lead = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i >= lead && (i - lead) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  if (bytes < 1000) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  for (value /= 1000.0; value >= 999.995 && unit + 1 < std::size(kUnits); value /= 1000.0) ++unit;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  return buf;
}

}  // namespace pinstage
