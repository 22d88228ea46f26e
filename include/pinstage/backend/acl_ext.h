/* The acl plugin's one extension beyond the platform ABI: how it pinned host memory (the
 * runtime's own, registered, or its aclrtMallocHost where the runtime's could not be
 * registered). Resolve it through
 * the plugin's get_proc_address slot (Worker::backend_extension in C++) by
 * PS_ACL_PIN_STATS_NAME and call it with a context that plugin created
 * (Worker::native_context). docs/acl.md describes the fields. */
#ifndef PINSTAGE_ACL_EXT_H
#define PINSTAGE_ACL_EXT_H

#include <stdint.h>

#include "pinstage/backend/platform_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* get_proc_address("acl.pin_stats") returns a ps_acl_pin_stats_fn. */
#define PS_ACL_PIN_STATS_NAME "acl.pin_stats"

/* Which way the latest pinning was made. */
typedef enum ps_acl_pin_mode {
  PS_ACL_PIN_NONE = 0,
  PS_ACL_PIN_MALLOC_HOST = 1, /* aclrtMallocHost: the vendor source */
  PS_ACL_PIN_REGISTER = 2     /* aclrtHostRegister of memory the runtime made (host_register) */
} ps_acl_pin_mode;

/* Totals over the context's life. unsupported_count: registrations the runtime of the card
 * answered ACL_ERROR_RT_FEATURE_NOT_SUPPORT (the runtime then took aclrtMallocHost). */
typedef struct ps_acl_pin_stats {
  uint64_t malloc_host_count, malloc_host_bytes;
  uint64_t register_count, register_bytes;
  uint64_t unsupported_count;
  int last_mode; /* ps_acl_pin_mode of the latest pinning */
  double last_seconds;
} ps_acl_pin_stats;

/* Copies the context's pinning statistics into *out; PS_ERR_INVALID_ARGUMENT on NULL. */
typedef int (*ps_acl_pin_stats_fn)(ps_device_ctx* ctx, ps_acl_pin_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_ACL_EXT_H */
