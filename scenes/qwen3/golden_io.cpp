// The golden as tensors and as a .safetensors file (docs/golden.md, "Saving").
#include <cstring>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/safetensors.h"

namespace pinstage::qwen3 {
namespace {

constexpr size_t kRowsPerLayer = static_cast<size_t>(kBatch) * kNumKvHeads;

void check_sizes(const Golden& golden, const std::string& who) {
  const size_t n = golden.kv_rows.size();
  if (golden.out.size() != static_cast<size_t>(kBatch) * kHidden ||
      golden.k_rows.size() != n * kHeadDim || golden.v_rows.size() != n * kHeadDim)
    throw Error(ErrorCode::invalid_argument, who + ": the golden is inconsistent (" +
                                                 std::to_string(golden.out.size()) +
                                                 " out values, " + std::to_string(n) + " rows, " +
                                                 std::to_string(golden.k_rows.size()) + "/" +
                                                 std::to_string(golden.v_rows.size()) +
                                                 " K/V values); use one compute_golden returned");
}

template <typename T>
Tensor make(const std::string& name, DType dtype, std::vector<int64_t> shape,
            const std::vector<T>& values, HostAllocator& allocator) {
  Tensor t = Tensor::empty(name, dtype, std::move(shape), Direction::out, allocator);
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> take(const TaskArgs& args, const std::string& path, const std::string& name,
                    DType dtype, const std::vector<int64_t>& shape) {
  const Tensor* t = args.find(name);
  if (t == nullptr)
    throw Error(ErrorCode::io, "load_golden: " + path + " has no tensor '" + name +
                                   "'; write it with save_golden");
  if (t->dtype() != dtype || t->shape() != shape)
    throw Error(ErrorCode::io, "load_golden: " + path + ": tensor '" + name + "' is " +
                                   dtype_name(t->dtype()) + " " + t->shape_string() +
                                   ", not what save_golden writes");
  std::vector<T> values(t->numel());
  if (!values.empty()) std::memcpy(values.data(), t->data(), t->nbytes());
  return values;
}

}  // namespace

TaskArgs golden_tensors(const Golden& golden, HostAllocator& allocator) {
  check_sizes(golden, "golden_tensors");
  const auto n = static_cast<int64_t>(golden.kv_rows.size());
  TaskArgs args;
  args.add(make("out", DType::bf16, {kBatch, kHidden}, golden.out, allocator));
  args.add(make("kv_rows", DType::i64, {n}, golden.kv_rows, allocator));
  args.add(make("k_rows", DType::bf16, {n, kHeadDim}, golden.k_rows, allocator));
  args.add(make("v_rows", DType::bf16, {n, kHeadDim}, golden.v_rows, allocator));
  return args;
}

uint64_t save_golden(const Golden& golden, const std::string& path) {
  PageableAllocator allocator;
  return save_safetensors(golden_tensors(golden, allocator), path);
}

Golden load_golden(const std::string& path) {
  PageableAllocator allocator;
  const TaskArgs args = load_safetensors(path, allocator);
  const Tensor* rows = args.find("kv_rows");
  if (rows == nullptr || rows->shape().size() != 1 || rows->shape()[0] % kRowsPerLayer != 0 ||
      rows->shape()[0] == 0)
    throw Error(ErrorCode::io, "load_golden: " + path +
                                   " has no 'kv_rows' of n_layers * 128 rows; write it with "
                                   "save_golden");
  const int64_t n = rows->shape()[0];
  Golden golden;
  golden.n_layers = static_cast<int>(n / static_cast<int64_t>(kRowsPerLayer));
  golden.out = take<uint16_t>(args, path, "out", DType::bf16, {kBatch, kHidden});
  golden.kv_rows = take<int64_t>(args, path, "kv_rows", DType::i64, {n});
  golden.k_rows = take<uint16_t>(args, path, "k_rows", DType::bf16, {n, kHeadDim});
  golden.v_rows = take<uint16_t>(args, path, "v_rows", DType::bf16, {n, kHeadDim});
  return golden;
}

}  // namespace pinstage::qwen3
