/* Plugin SDK: the cuda plugin's one extension beyond the platform ABI, how long pinning
 * took. Resolve it through the plugin's get_proc_address slot (Worker::backend_extension
 * in C++) by PS_CUDA_PIN_STATS_NAME and call it with a context that plugin created
 * (Worker::native_context). docs/cuda.md describes the fields. */
#ifndef PINSTAGE_CUDA_EXT_H
#define PINSTAGE_CUDA_EXT_H

#include <stdint.h>

#include "pinstage/backend/platform_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* get_proc_address("cuda.pin_stats") returns a ps_cuda_pin_stats_fn. */
#define PS_CUDA_PIN_STATS_NAME "cuda.pin_stats"

/* Which way a pinned buffer was made. */
typedef enum ps_cuda_pin_mode {
  PS_CUDA_PIN_NONE = 0,
  PS_CUDA_PIN_ALLOC = 1,   /* cudaHostAlloc(portable) */
  PS_CUDA_PIN_REGISTER = 2 /* mmap + parallel pre-fault + cudaHostRegister(portable) */
} ps_cuda_pin_mode;

/* Totals over the context's life, and the breakdown of its latest pinned allocation. */
typedef struct ps_cuda_pin_stats {
  uint64_t alloc_count, alloc_bytes; /* cudaHostAlloc mode */
  double alloc_seconds, alloc_free_seconds;
  uint64_t register_count, register_bytes; /* register mode */
  double register_seconds, register_free_seconds;

  /* The last_* fields stay the tail of the struct: the backend copies them as one block. */
  int last_mode; /* ps_cuda_pin_mode of the latest allocation */
  uint64_t last_bytes;
  double last_seconds;          /* the whole host_alloc_pinned call */
  double last_map_seconds;      /* register mode: mmap */
  double last_prefault_seconds; /* register mode: pre-faulting */
  double last_register_seconds; /* register mode: cudaHostRegister */
  int last_prefault_threads;
  int last_populate_write; /* 1 when madvise(MADV_POPULATE_WRITE) did the faulting */
} ps_cuda_pin_stats;

/* Copies the context's pinning statistics into *out; PS_ERR_INVALID_ARGUMENT on NULL. */
typedef int (*ps_cuda_pin_stats_fn)(ps_device_ctx* ctx, ps_cuda_pin_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_CUDA_EXT_H */
