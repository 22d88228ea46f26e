// load_tp_to_host: a checkpoint read once for N tensor-parallel ranks. Replicated tensors
// and splits whose slices are byte ranges are read straight into their storages by one
// read; a split along an inner dimension is read in batches of whole rows into
// a staging buffer and each row's pieces copied to the ranks (see Note [Read once]).
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/load_internal.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"

namespace pinstage {

// Note [Read once]
// Every byte of the checkpoint is asked of the files exactly once: a replicated tensor
// is read into one storage all ranks share; a contiguous split (every dimension before
// the split dimension of size 1, dim 0 included) is one byte range per rank, read into
// that rank's storage; a strided split is read row by row (a "row" is one index of the
// dimensions before the split, holding all of the split dimension and those after) into
// the staging buffer, and each row holds one piece per rank. TpLoadReport::read_bytes
// adds up what the reads were asked for, so a test can check it equals the
// checkpoint's bytes, and that every slice's bytes are right: together they mean no byte
// was read twice. The staging buffer is pageable memory of at most kStageBytes (or one
// row, when a row is larger), reused for every batch.

namespace detail {

TpGeometry tp_geometry(const CheckpointTensor& t, int dim) {
  TpGeometry g;
  const auto d = static_cast<size_t>(dim);
  g.inner_bytes = t.element_size;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i < d) g.outer *= static_cast<uint64_t>(t.shape[i]);
    if (i > d) g.inner_bytes *= static_cast<uint64_t>(t.shape[i]);
  }
  g.row_bytes = g.inner_bytes * static_cast<uint64_t>(t.shape[d]);
  return g;
}

}  // namespace detail

namespace {

constexpr uint64_t kStageBytes = uint64_t{256} << 20;

// How a tensor is laid out around its split dimension.
struct Job {
  const TpDecision* d = nullptr;
  uint64_t outer = 1;         // rows: the product of the dimensions before the split
  uint64_t inner_bytes = 0;   // bytes of one index of the split dimension within a row
  uint64_t row_bytes = 0;     // inner_bytes * the split dimension's size
  std::vector<TpPart> parts;  // per rank; empty when replicated
  std::vector<std::shared_ptr<Storage>> storages;  // one (replicated) or one per rank
  std::optional<uint64_t> digest;                  // strided: the hash of the bytes read
  // Rows of no bytes (a later dimension of size 0) are a contiguous split of 0 bytes.
  bool strided() const { return !parts.empty() && outer > 1 && row_bytes > 0; }
};

Job job_of(const TpDecision& d, int tp) {
  Job j;
  j.d = &d;
  if (d.dim < 0) return j;
  const CheckpointTensor& t = *d.tensor;
  const detail::TpGeometry g = detail::tp_geometry(t, d.dim);
  j.outer = g.outer;
  j.inner_bytes = g.inner_bytes;
  j.row_bytes = g.row_bytes;
  const int64_t size = t.shape[static_cast<size_t>(d.dim)];
  for (int r = 0; r < tp; ++r) j.parts.push_back(tp_part(size, tp, r));
  return j;
}

uint64_t slice_bytes(const Job& j, int rank) {
  if (j.parts.empty()) return j.d->tensor->bytes;
  return j.outer * j.inner_bytes * static_cast<uint64_t>(j.parts[static_cast<size_t>(rank)].count);
}

// Every storage, from its rank's allocator (a replicated tensor from rank 0's), with one
// reserve() per allocator first (a pool maps them as one segment). Anything allocated
// stays owned by `jobs`, so an exception frees it with them.
uint64_t allocate(std::vector<Job>& jobs, int tp, std::span<HostAllocator* const> allocators) {
  auto of_rank = [&](const Job& j, int r) {
    return allocators[j.parts.empty() ? 0 : static_cast<size_t>(r)];
  };
  for (size_t a = 0; a < allocators.size(); ++a) {
    if (std::find(allocators.begin(), allocators.begin() + static_cast<ptrdiff_t>(a),
                  allocators[a]) != allocators.begin() + static_cast<ptrdiff_t>(a))
      continue;  // reserved with its first rank
    std::vector<size_t> sizes;
    for (const Job& j : jobs)
      for (int r = 0; r < (j.parts.empty() ? 1 : tp); ++r)
        if (of_rank(j, r) == allocators[a]) sizes.push_back(static_cast<size_t>(slice_bytes(j, r)));
    allocators[a]->reserve(sizes);
  }
  uint64_t total = 0;
  for (Job& j : jobs)
    for (int r = 0; r < (j.parts.empty() ? 1 : tp); ++r) {
      j.storages.push_back(of_rank(j, r)->allocate(static_cast<size_t>(slice_bytes(j, r))));
      total += slice_bytes(j, r);
    }
  return total;
}

// Adds one read's report to the load's.
void add_read(TpLoadReport& r, const LoadReport& one) {
  r.read_bytes += one.bytes;
  r.load.bytes += one.bytes;
  r.load.read_s += one.read_s;
  r.load.direct = r.load.direct && one.direct;
  if (!one.direct_note.empty()) r.load.direct_note = one.direct_note;
  r.load.threads = one.threads;
}

// Replicated tensors and contiguous splits: one parallel read straight into the storages.
void read_direct(const Checkpoint& c, std::vector<Job>& jobs, int tp,
                 const CheckpointLoadOptions& p, TpLoadReport& r, uint64_t* base) {
  std::vector<detail::FileRange> ranges;
  for (Job& j : jobs) {
    if (j.strided()) continue;
    const CheckpointTensor& t = *j.d->tensor;
    if (j.parts.empty()) {
      ranges.push_back({t.file, t.offset, t.bytes, j.storages[0]->data()});
      continue;
    }
    for (int rank = 0; rank < tp; ++rank) {
      const auto begin = static_cast<uint64_t>(j.parts[static_cast<size_t>(rank)].begin);
      ranges.push_back({t.file, t.offset + j.outer * j.inner_bytes * begin, slice_bytes(j, rank),
                        j.storages[static_cast<size_t>(rank)]->data()});
    }
  }
  add_read(r, detail::read_ranges(c, ranges, p));
  *base = r.read_bytes;
}

// Copies rows [0, n) of the staging buffer (rows `first`.. of the tensor) to the ranks.
void scatter(const Job& j, int tp, const unsigned char* stage, uint64_t first, uint64_t n,
             int threads) {
  parallel_for(
      static_cast<size_t>(n), 64,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i)
          for (int rank = 0; rank < tp; ++rank) {
            const TpPart& part = j.parts[static_cast<size_t>(rank)];
            const uint64_t piece = j.inner_bytes * static_cast<uint64_t>(part.count);
            auto* dst = static_cast<unsigned char*>(j.storages[static_cast<size_t>(rank)]->data());
            std::memcpy(dst + (first + i) * piece,
                        stage + i * j.row_bytes + j.inner_bytes * static_cast<uint64_t>(part.begin),
                        piece);
          }
      },
      threads);
}

// A strided split: batches of whole rows into the staging buffer, then scattered.
void read_strided(const Checkpoint& c, Job& j, int tp, std::vector<unsigned char>& stage,
                  const CheckpointLoadOptions& p, bool hash, TpLoadReport& r, uint64_t* base) {
  const uint64_t budget =
      std::min(kStageBytes, p.chunk_bytes * static_cast<uint64_t>(std::max(r.load.threads, 1)));
  const uint64_t batch = std::min(j.outer, std::max<uint64_t>(1, budget / j.row_bytes));
  if (stage.size() < batch * j.row_bytes) stage.resize(static_cast<size_t>(batch * j.row_bytes));
  Xxh3Stream stream;
  for (uint64_t row = 0; row < j.outer; row += batch) {
    const uint64_t n = std::min(batch, j.outer - row);
    const CheckpointTensor& t = *j.d->tensor;
    const uint64_t bytes = n * j.row_bytes;
    add_read(r, detail::read_ranges(
                    c, {{t.file, t.offset + row * j.row_bytes, bytes, stage.data()}}, p));
    *base = r.read_bytes;
    if (hash) stream.update(stage.data(), static_cast<size_t>(bytes));
    const Stopwatch copy;
    scatter(j, tp, stage.data(), row, n, p.threads);
    r.scatter_s += copy.seconds();
    r.scatter_bytes += bytes;
  }
  if (hash) j.digest = stream.digest();
}

// Each hashed tensor's bytes, whole or across its slices in rank order, against its hash.
void verify(const Checkpoint& c, const std::vector<Job>& jobs, const CheckpointLoadOptions& o,
            TpLoadReport& r) {
  const auto digest = [&](size_t i) -> uint64_t {
    const Job& j = jobs[i];
    if (j.digest) return *j.digest;
    Xxh3Stream stream;
    for (const auto& s : j.storages) stream.update(s->data(), s->bytes());
    return stream.digest();
  };
  detail::verify_hashes(
      c, o, jobs.size(), [&](size_t i) -> const CheckpointTensor& { return *jobs[i].d->tensor; },
      digest, r.load);
}

std::vector<std::vector<TpTensor>> by_rank(const std::vector<Job>& jobs, int tp,
                                           TpLoadReport& report) {
  std::vector<std::vector<TpTensor>> ranks(static_cast<size_t>(tp));
  report.ranks.assign(static_cast<size_t>(tp), {});
  for (int rank = 0; rank < tp; ++rank)
    for (const Job& j : jobs) {
      TpTensor t;
      t.info = *j.d->tensor;
      t.shape = t.info.shape;
      t.dim = j.d->dim;
      t.rule = j.d->rule;
      t.bytes = slice_bytes(j, rank);
      t.staged = j.strided();
      TpRankReport& r = report.ranks[static_cast<size_t>(rank)];
      r.bytes += t.bytes;
      (j.parts.empty() ? r.shared_bytes : t.staged ? r.scatter_bytes : r.direct_bytes) += t.bytes;
      if (j.parts.empty()) {
        t.storage = j.storages[0];
      } else {
        const TpPart& part = j.parts[static_cast<size_t>(rank)];
        t.shape[static_cast<size_t>(t.dim)] = part.count;
        t.begin = part.begin;
        t.storage = j.storages[static_cast<size_t>(rank)];
      }
      ranks[static_cast<size_t>(rank)].push_back(std::move(t));
    }
  return ranks;
}

void count_kinds(const std::vector<Job>& jobs, const TpPlan& plan, TpLoadReport& r) {
  std::vector<bool> used(plan.rules().size(), false);
  for (const Job& j : jobs) {
    if (j.d->rule >= 0) used[static_cast<size_t>(j.d->rule)] = true;
    if (j.parts.empty())
      ++r.replicated;
    else if (j.strided())
      ++r.strided;
    else
      ++r.contiguous;
  }
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) r.unused_rules.push_back(static_cast<int>(i));
}

}  // namespace

TpHostLoad load_tp_to_host(const Checkpoint& c, const TpPlan& plan, int tp,
                           HostAllocator& allocator, const CheckpointLoadOptions& o) {
  const std::vector<TpDecision> decisions = resolve_tp_plan(c, plan, tp);
  const std::vector<HostAllocator*> allocators(static_cast<size_t>(tp), &allocator);
  return load_tp_to_host(c, plan, tp, allocators, o);
}

TpHostLoad load_tp_to_host(const Checkpoint& c, const TpPlan& plan, int tp,
                           std::span<HostAllocator* const> allocators,
                           const CheckpointLoadOptions& o) {
  detail::check_load_options(o, false);
  const std::vector<TpDecision> decisions = resolve_tp_plan(c, plan, tp);
  if (allocators.size() != static_cast<size_t>(tp) ||
      std::find(allocators.begin(), allocators.end(), nullptr) != allocators.end())
    throw Error(ErrorCode::invalid_argument,
                "load_tp_to_host: " + std::to_string(allocators.size()) + " allocators for tp " +
                    std::to_string(tp) + " (one per rank, none null)");
  std::vector<const CheckpointTensor*> all;
  all.reserve(decisions.size());
  for (const TpDecision& d : decisions) all.push_back(d.tensor);
  check_sidecar(c, o);  // every refusal before any memory is taken
  detail::check_verifiable(c, all, o);
  const Stopwatch total;
  TpHostLoad out;
  out.tp = tp;
  TpLoadReport& r = out.report;
  r.checkpoint_bytes = c.total_bytes();
  r.load.tensors = c.tensors().size();
  r.load.files = c.files().size();
  r.load.chunk_bytes = o.chunk_bytes;
  r.load.direct = o.direct;
  r.load.threads = o.threads > 0 ? o.threads : default_thread_count();
  std::vector<Job> jobs;
  jobs.reserve(decisions.size());
  for (const TpDecision& d : decisions) jobs.push_back(job_of(d, tp));
  count_kinds(jobs, plan, r);
  detail::enter_phase(o, "allocate");
  const Stopwatch alloc;
  r.host_bytes = allocate(jobs, tp, allocators);
  r.load.alloc_s = alloc.seconds();
  uint64_t base = 0;
  const CheckpointLoadOptions p = detail::part_options(o, &base, r.checkpoint_bytes);
  detail::enter_phase(o, "read");
  read_direct(c, jobs, tp, p, r, &base);
  std::vector<unsigned char> stage;
  for (Job& j : jobs)
    if (j.strided()) read_strided(c, j, tp, stage, p, o.verify, r, &base);
  const Stopwatch pin;
  for (HostAllocator* a : allocators) a->finish();  // what reserve() left to the writers
  r.load.pin_s = pin.seconds();
  verify(c, jobs, o, r);
  out.ranks = by_rank(jobs, tp, r);
  r.load.total_s = total.seconds();
  return out;
}

}  // namespace pinstage
