// One tensor-parallel rank loaded alone: its slices (tp_rank_slices), the file pieces they
// are made of (tp_slice_pieces), a read of those pieces only (read_tp_slices), and the
// copy of a slice out of memory holding the whole tensor (copy_tp_slice), which the
// Python distributed loader's "once per node" mode uses (docs/distributed.md).
#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "checkpoint/load_internal.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/parallel.h"

namespace pinstage {

namespace {

// Pieces smaller than this are copied many to a thread task; larger ones split by bytes.
constexpr size_t kPieceGrain = 64;

void refuse_verify(const CheckpointLoadOptions& o) {
  if (o.verify)
    throw Error(ErrorCode::invalid_argument,
                "tp rank load: verify is refused: a rank's slice is no whole tensor to check "
                "against its recorded hash (load_tp_to_host verifies every rank at once)");
}

bool strided(const TpTensor& s) {
  if (s.dim < 0) return false;
  const detail::TpGeometry g = detail::tp_geometry(s.info, s.dim);
  return g.outer > 1 && g.row_bytes > 0;
}

}  // namespace

std::vector<TpTensor> tp_rank_slices(const Checkpoint& c, const TpPlan& plan, int tp, int rank) {
  const std::vector<TpDecision> decisions = resolve_tp_plan(c, plan, tp);
  if (rank < 0 || rank >= tp)
    throw Error(ErrorCode::invalid_argument, "tp load: rank " + std::to_string(rank) +
                                                 " is not in [0, " + std::to_string(tp) +
                                                 ") for tp " + std::to_string(tp));
  std::vector<TpTensor> out;
  out.reserve(decisions.size());
  for (const TpDecision& d : decisions) {
    TpTensor t;
    t.info = *d.tensor;
    t.shape = t.info.shape;
    t.dim = d.dim;
    t.rule = d.rule;
    t.bytes = t.info.bytes;
    if (d.dim >= 0) {
      const auto dim = static_cast<size_t>(d.dim);
      const TpPart part = tp_part(t.info.shape[dim], tp, rank);
      const detail::TpGeometry g = detail::tp_geometry(t.info, d.dim);
      t.shape[dim] = part.count;
      t.begin = part.begin;
      t.bytes = g.outer * g.inner_bytes * static_cast<uint64_t>(part.count);
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<TpPiece> tp_slice_pieces(const TpTensor& s) {
  if (s.dim < 0) return {{0, s.info.bytes, 0}};
  const detail::TpGeometry g = detail::tp_geometry(s.info, s.dim);
  const uint64_t piece = g.inner_bytes * static_cast<uint64_t>(s.shape[static_cast<size_t>(s.dim)]);
  const uint64_t start = g.inner_bytes * static_cast<uint64_t>(s.begin);
  if (g.outer <= 1 || g.row_bytes == 0 || piece == g.row_bytes)  // one run of bytes
    return {{g.outer <= 1 ? start : 0, s.bytes, 0}};
  std::vector<TpPiece> out;
  out.reserve(static_cast<size_t>(g.outer));
  for (uint64_t row = 0; row < g.outer; ++row)
    out.push_back({row * g.row_bytes + start, piece, row * piece});
  return out;
}

TpLoadReport read_tp_slices(const Checkpoint& c, const std::vector<TpTensor>& slices,
                            const std::vector<void*>& dsts, const CheckpointLoadOptions& o) {
  detail::check_load_options(o, false);
  refuse_verify(o);
  if (dsts.size() != slices.size())
    throw Error(ErrorCode::invalid_argument, "tp rank load: " + std::to_string(dsts.size()) +
                                                 " destinations for " +
                                                 std::to_string(slices.size()) + " slices");
  std::deque<CheckpointTensor> pieces;  // stable addresses for the targets
  std::vector<ReadTarget> targets;
  TpLoadReport r;
  for (size_t i = 0; i < slices.size(); ++i) {
    const TpTensor& s = slices[i];
    if (s.bytes > 0 && dsts[i] == nullptr)
      throw Error(ErrorCode::invalid_argument,
                  "tp rank load: no memory given for tensor '" + s.info.name + "'");
    if (s.dim < 0)
      ++r.replicated;
    else if (strided(s))
      ++r.strided;
    else
      ++r.contiguous;
    for (const TpPiece& p : tp_slice_pieces(s)) {
      if (p.bytes == 0) continue;
      CheckpointTensor piece = s.info;
      piece.offset += p.offset;
      piece.bytes = p.bytes;
      piece.xxh3.reset();
      pieces.push_back(std::move(piece));
      targets.push_back({&pieces.back(), static_cast<unsigned char*>(dsts[i]) + p.slice_offset});
    }
  }
  r.load = read_checkpoint(c, targets, o);
  r.load.tensors = slices.size();
  r.read_bytes = r.load.bytes;
  r.checkpoint_bytes = c.total_bytes();
  return r;
}

void copy_tp_slice(const TpTensor& s, const void* whole, void* dst, int threads) {
  const std::vector<TpPiece> pieces = tp_slice_pieces(s);
  const auto* src = static_cast<const unsigned char*>(whole);
  auto* out = static_cast<unsigned char*>(dst);
  if (pieces.size() == 1) {
    if (pieces[0].bytes > 0)
      parallel_memcpy(out, src + pieces[0].offset, static_cast<size_t>(pieces[0].bytes), threads);
    return;
  }
  parallel_for(
      pieces.size(), kPieceGrain,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i)
          std::memcpy(out + pieces[i].slice_offset, src + pieces[i].offset,
                      static_cast<size_t>(pieces[i].bytes));
      },
      threads);
}

TpRankLoad load_tp_rank_to_host(const Checkpoint& c, const TpPlan& plan, int tp, int rank,
                                HostAllocator& allocator, const CheckpointLoadOptions& o) {
  detail::check_load_options(o, false);
  refuse_verify(o);  // every refusal before any memory is taken
  const Stopwatch total;
  TpRankLoad out;
  out.tp = tp;
  out.rank = rank;
  out.tensors = tp_rank_slices(c, plan, tp, rank);
  std::vector<size_t> sizes;
  for (const TpTensor& t : out.tensors) sizes.push_back(static_cast<size_t>(t.bytes));
  detail::enter_phase(o, "allocate");
  const Stopwatch alloc;
  allocator.reserve(sizes);
  std::vector<void*> dsts;
  uint64_t host = 0;
  for (TpTensor& t : out.tensors) {  // owned by `out`: an exception frees them with it
    t.storage = allocator.allocate(static_cast<size_t>(t.bytes));
    dsts.push_back(t.storage->data());
    host += t.bytes;
  }
  const double alloc_s = alloc.seconds();
  out.report = read_tp_slices(c, out.tensors, dsts, o);
  out.report.host_bytes = host;
  out.report.load.alloc_s = alloc_s;
  std::vector<bool> used(plan.rules().size(), false);
  for (const TpTensor& t : out.tensors)
    if (t.rule >= 0) used[static_cast<size_t>(t.rule)] = true;
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) out.report.unused_rules.push_back(static_cast<int>(i));
  out.report.load.total_s = total.seconds();
  return out;
}

}  // namespace pinstage
