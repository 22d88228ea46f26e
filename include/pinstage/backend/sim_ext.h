/* Plugin SDK: the sim plugin's extensions beyond the platform ABI. sim.stats: what its driver
 * model did: which path each copy took (pinned memory DMA'd directly, pageable memory
 * staged through bounce buffers), the link pacing, and the device pool. Resolve it
 * through the plugin's get_proc_address slot (Worker::backend_extension in C++) by
 * PS_SIM_STATS_NAME and call it with a context that plugin created
 * (Worker::native_context). docs/worker.md ("sim semantics") describes the model. */
#ifndef PINSTAGE_SIM_EXT_H
#define PINSTAGE_SIM_EXT_H

#include <stdint.h>

#include "pinstage/backend/platform_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* get_proc_address("sim.stats") returns a ps_sim_stats_fn. */
#define PS_SIM_STATS_NAME "sim.stats"

/* Most workers a sim copy engine runs (the backend option dma_threads). */
#define PS_SIM_DMA_THREADS_MAX 64

/* Totals over the context's life, and its settings and pool now. */
typedef struct ps_sim_stats {
  /* Copies (sync and async) by direction and path: "direct" when the host side lies in
   * one pinned allocation of this context, "bounced" otherwise. */
  uint64_t h2d_direct_count, h2d_direct_bytes;
  uint64_t h2d_bounced_count, h2d_bounced_bytes;
  uint64_t d2h_direct_count, d2h_direct_bytes;
  uint64_t d2h_bounced_count, d2h_bounced_bytes;
  double link_wait_seconds; /* time the copy engines waited for the link (link_gbps) */

  /* The driver's settings (backend options bounce_chunk, bounce_buffers, link_gbps). */
  uint64_t bounce_chunk_bytes;
  int bounce_buffers; /* per direction */
  int bounce_locked;  /* 1 when every bounce buffer is mlock'ed */
  int64_t link_gbps;  /* 0 = unpaced */

  /* The copy engines (backend option dma_threads): workers per engine, the bytes each
   * host-to-device and device-to-host worker copied (entries from dma_threads on are 0),
   * and the bytes the copying threads staged through the bounce buffers (one pass per
   * pageable byte). */
  int dma_threads;
  uint64_t h2d_dma_thread_bytes[PS_SIM_DMA_THREADS_MAX];
  uint64_t d2h_dma_thread_bytes[PS_SIM_DMA_THREADS_MAX];
  uint64_t h2d_staged_bytes, d2h_staged_bytes;

  /* The device pool (docs/worker.md): bytes it can hand out, in live blocks, backed so
   * far (the high-water mark; freed blocks stay backed), its free ranges after
   * coalescing, the largest of them, and the time spent backing pages. */
  uint64_t pool_span_bytes, pool_used_bytes, pool_backed_bytes;
  uint64_t pool_free_blocks, pool_largest_free_bytes;
  double pool_backing_seconds;
} ps_sim_stats;

/* Copies the context's statistics into *out; PS_ERR_INVALID_ARGUMENT on NULL. */
typedef int (*ps_sim_stats_fn)(ps_device_ctx* ctx, ps_sim_stats* out);

/* get_proc_address("sim.hold_streams") returns a ps_sim_hold_streams_fn: a test seam. While
 * held (hold != 0), no stream of the context starts its next queued task, so a test can
 * keep a copy queued as long as it needs (a latch, not a sleep); hold = 0 lets them run. */
#define PS_SIM_HOLD_STREAMS_NAME "sim.hold_streams"
typedef int (*ps_sim_hold_streams_fn)(ps_device_ctx* ctx, int hold);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_SIM_EXT_H */
