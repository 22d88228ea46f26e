// Reading a slice of one checkpoint tensor: the file ranges the slice covers, read by the
// loaders' parallel pread, so a slice of rows or columns asks the files for its own bytes
// and no others (safe_open(...).get_slice(name)[...] in Python). See docs/loading.md.
#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/load_internal.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"

namespace pinstage {

namespace {

// Ranges per read: bounds the chunk list a read builds, whatever the slice.
constexpr size_t kRangesPerRead = size_t{1} << 16;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] void bad_slice(const CheckpointTensor& t, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "slice of tensor '" + t.name.substr(0, 96) +
                                               "' (shape " + shape_text(t.shape) + "): " + what);
}

void check_slice(const CheckpointTensor& t, const std::vector<SliceDim>& slice) {
  if (slice.size() != t.shape.size())
    bad_slice(t, std::to_string(slice.size()) + " dims given for a tensor of " +
                     std::to_string(t.shape.size()));
  for (size_t d = 0; d < slice.size(); ++d) {
    const SliceDim& s = slice[d];
    const int64_t size = t.shape[d];
    const std::string dim = "dim " + std::to_string(d) + " (begin " + std::to_string(s.begin) +
                            ", count " + std::to_string(s.count) + ", step " +
                            std::to_string(s.step) + ")";
    if (s.begin < 0 || s.count < 0) bad_slice(t, dim + ": begin and count must be >= 0");
    if (s.step < 1) bad_slice(t, dim + ": the step must be >= 1");
    // begin + (count - 1) * step < size, without overflow.
    if (s.begin > size ||
        (s.count > 0 && (s.begin == size || (s.count - 1) > (size - 1 - s.begin) / s.step)))
      bad_slice(t, dim + " reaches past the dim's size " + std::to_string(size));
  }
}

}  // namespace

std::vector<SliceRange> tensor_slice_ranges(const CheckpointTensor& t,
                                            const std::vector<SliceDim>& slice) {
  check_slice(t, slice);
  const size_t n = slice.size();
  std::vector<uint64_t> stride(n);  // bytes between consecutive indices of each dim
  uint64_t acc = t.element_size;
  for (size_t d = n; d-- > 0;) {
    stride[d] = acc;
    acc *= static_cast<uint64_t>(t.shape[d]);
  }
  for (const SliceDim& s : slice)
    if (s.count == 0) return {};
  if (t.bytes == 0) return {};
  // k: the innermost dim not taken whole; every dim after it is whole, so one index of
  // dim k (all of them, at step 1) and everything after it is one range.
  auto whole = [&](size_t d) { return slice[d].begin == 0 && slice[d].count == t.shape[d]; };
  size_t k = n;
  while (k > 0 && whole(k - 1)) --k;
  if (k == 0) return {{t.offset, t.bytes}};
  --k;
  const bool stepped = slice[k].step > 1 && slice[k].count > 1;
  const size_t m = stepped ? k + 1 : k;  // the dims walked, one range per combination
  const uint64_t run = stepped ? stride[k] : stride[k] * static_cast<uint64_t>(slice[k].count);
  uint64_t ranges = 1;
  for (size_t d = 0; d < m; ++d) {
    ranges *= static_cast<uint64_t>(slice[d].count);
    if (ranges > kSliceMaxRanges)
      bad_slice(t, "it covers more than " + std::to_string(kSliceMaxRanges) +
                       " separate byte ranges (a step along an inner dim reads element by "
                       "element); read the dim whole and slice it in memory");
  }
  std::vector<SliceRange> out;
  out.reserve(static_cast<size_t>(ranges));
  std::vector<int64_t> idx(m, 0);
  for (;;) {
    uint64_t off = t.offset;
    for (size_t d = 0; d < m; ++d)
      off += static_cast<uint64_t>(slice[d].begin + idx[d] * slice[d].step) * stride[d];
    if (!stepped) off += static_cast<uint64_t>(slice[k].begin) * stride[k];
    if (!out.empty() && out.back().offset + out.back().bytes == off)
      out.back().bytes += run;
    else
      out.push_back({off, run});
    size_t d = m;
    while (d > 0 && ++idx[d - 1] == slice[d - 1].count) idx[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

LoadReport read_tensor_slice(const Checkpoint& c, const CheckpointTensor& t,
                             const std::vector<SliceDim>& slice, void* dst,
                             const CheckpointLoadOptions& o) {
  detail::check_load_options(o, false);
  if (o.verify && !o.verify_if_present)
    throw Error(ErrorCode::invalid_argument,
                "checkpoint '" + c.path() + "': verify cannot check a slice of tensor '" +
                    t.name.substr(0, 96) +
                    "': its recorded xxh3-64 covers the whole tensor; read the tensor whole to "
                    "verify it, or verify only what can be checked (verify_if_present)");
  const std::vector<SliceRange> ranges = tensor_slice_ranges(t, slice);
  const Stopwatch total;
  uint64_t bytes = 0;
  for (const SliceRange& g : ranges) bytes += g.bytes;
  LoadReport r;
  r.files = c.files().size();
  r.chunk_bytes = o.chunk_bytes;
  r.direct = o.direct;
  uint64_t base = 0;
  const CheckpointLoadOptions p = detail::part_options(o, &base, bytes);
  auto* out = static_cast<unsigned char*>(dst);
  detail::enter_phase(o, "read");
  for (size_t i = 0; i < ranges.size() || i == 0; i += kRangesPerRead) {
    std::vector<detail::FileRange> part;
    for (size_t j = i; j < std::min(ranges.size(), i + kRangesPerRead); ++j) {
      part.push_back({t.file, ranges[j].offset, ranges[j].bytes, out});
      out += ranges[j].bytes;
    }
    const LoadReport one = detail::read_ranges(c, part, p);
    base += one.bytes;
    r.bytes += one.bytes;
    r.read_s += one.read_s;
    r.threads = one.threads;
    r.direct = r.direct && one.direct;
    if (!one.direct_note.empty()) r.direct_note = one.direct_note;
  }
  r.tensors = 1;
  r.unverified = o.verify ? 1 : 0;
  r.total_s = total.seconds();
  return r;
}

}  // namespace pinstage
