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

/* Which way the latest pinning was made. */
typedef enum ps_cuda_pin_mode {
  PS_CUDA_PIN_NONE = 0,
  PS_CUDA_PIN_ALLOC = 1,   /* cudaHostAlloc(portable): the vendor source, where the runtime
                              cannot use its own memory */
  PS_CUDA_PIN_REGISTER = 2 /* cudaHostRegister(portable) of memory the runtime made
                              (host_register), in pieces of register_chunk_mb */
} ps_cuda_pin_mode;

/* Totals over the context's life, and its latest pinning. */
typedef struct ps_cuda_pin_stats {
  uint64_t alloc_count, alloc_bytes; /* cudaHostAlloc */
  double alloc_seconds, alloc_free_seconds;
  uint64_t register_count, register_bytes; /* host_register */
  double register_seconds, register_free_seconds;
  uint64_t read_only_count; /* of them, with cudaHostRegisterReadOnly */
  int read_only_supported;  /* cudaDevAttrHostRegisterReadOnlySupported of the device */
  int last_mode;            /* ps_cuda_pin_mode of the latest pinning */
  uint64_t last_bytes;
  double last_seconds; /* the whole cudaHostAlloc or cudaHostRegister */
} ps_cuda_pin_stats;

/* Copies the context's pinning statistics into *out; PS_ERR_INVALID_ARGUMENT on NULL. */
typedef int (*ps_cuda_pin_stats_fn)(ps_device_ctx* ctx, ps_cuda_pin_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_CUDA_EXT_H */
