/* pinstage platform ABI: the C contract between the runtime and a backend plugin.
 *
 * A plugin is a shared object that exports one symbol, PINSTAGE_PLATFORM_ENTRY_SYMBOL,
 * returning a pointer to a static ps_platform_api table. The runtime dlopens the plugin
 * once, checks api_version, and resolves the table once (no dlsym per call).
 *
 * Rules every plugin follows:
 *  - Every slot except create_context/last_error takes the opaque device context first,
 *    so a call always runs against the worker's own device, never the calling thread's.
 *  - Every slot returns a ps_status (0 on success, a negative code otherwise), null-checks
 *    its arguments and catches every exception (nothing unwinds through C).
 *  - On failure a slot may leave a detail message for the calling thread, read through
 *    last_error (for example the CUDA driver's error string).
 *  - Slots marked OPTIONAL may be NULL; the runtime then supplies the default
 *    (synchronous copies for the async slots, "unsupported" for the rest).
 */
#ifndef PINSTAGE_PLATFORM_ABI_H
#define PINSTAGE_PLATFORM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to the table's layout or to a slot's meaning. */
#define PINSTAGE_PLATFORM_API_VERSION 2u
#define PINSTAGE_PLATFORM_ENTRY_SYMBOL "pinstage_platform_entry"

typedef enum ps_status {
  PS_OK = 0,
  PS_ERR_INVALID_ARGUMENT = -1, /* null pointer, zero or absurd size, bad option */
  PS_ERR_OUT_OF_MEMORY = -2,    /* device capacity or host memory exhausted */
  PS_ERR_UNKNOWN_POINTER = -3,  /* free/unregister of a pointer the backend does not own */
  PS_ERR_NO_DEVICE = -4,        /* no such device, or no driver */
  PS_ERR_UNSUPPORTED = -5,      /* the backend does not provide this operation */
  PS_ERR_COPY_FAILED = -6,      /* a host/device copy failed */
  PS_ERR_INJECTED_FAULT = -7,   /* a failure requested through the fault hook (tests) */
  PS_ERR_NOT_FOUND = -8,        /* no callable of that name */
  PS_ERR_BACKEND = -9,          /* any other backend failure; see last_error */
  PS_ERR_INTERNAL = -10         /* an exception or broken invariant inside the plugin */
} ps_status;

/* Name of a status code ("PS_ERR_OUT_OF_MEMORY"); never NULL. */
static inline const char* ps_status_str(int status) {
  switch (status) {
    case PS_OK:
      return "PS_OK";
    case PS_ERR_INVALID_ARGUMENT:
      return "PS_ERR_INVALID_ARGUMENT";
    case PS_ERR_OUT_OF_MEMORY:
      return "PS_ERR_OUT_OF_MEMORY";
    case PS_ERR_UNKNOWN_POINTER:
      return "PS_ERR_UNKNOWN_POINTER";
    case PS_ERR_NO_DEVICE:
      return "PS_ERR_NO_DEVICE";
    case PS_ERR_UNSUPPORTED:
      return "PS_ERR_UNSUPPORTED";
    case PS_ERR_COPY_FAILED:
      return "PS_ERR_COPY_FAILED";
    case PS_ERR_INJECTED_FAULT:
      return "PS_ERR_INJECTED_FAULT";
    case PS_ERR_NOT_FOUND:
      return "PS_ERR_NOT_FOUND";
    case PS_ERR_BACKEND:
      return "PS_ERR_BACKEND";
    case PS_ERR_INTERNAL:
      return "PS_ERR_INTERNAL";
    default:
      return "PS_ERR_UNKNOWN_STATUS";
  }
}

typedef struct ps_device_ctx ps_device_ctx; /* opaque, owned by the plugin */
typedef struct ps_stream ps_stream;         /* opaque copy queue (a CUDA stream) */
typedef struct ps_event ps_event;           /* opaque completion marker on a stream */

typedef struct ps_context_options {
  /* Device memory the context may commit; 0 = the backend's default. */
  uint64_t device_capacity_bytes;
  /* Backend-specific "key=value;key=value" settings, or NULL. */
  const char* config;
} ps_context_options;

typedef struct ps_capabilities {
  int pinned_is_page_locked; /* 1 when pinned host memory is really locked in RAM */
  int async_copy;            /* 1 when async copies overlap with host work */
  int host_register;         /* 1 when host_register/unregister are supported */
  int execute;               /* 1 when the backend can run callables (execute slot) */
  /* 1 when device memory is ordinary host RAM (sim): sizing must count it against the
   * host's memory, and a host-to-"device" copy is a memcpy (added in version 2). */
  int device_memory_is_host;
} ps_capabilities;

/* The operation kinds the fault hook can fail. */
typedef enum ps_fault_kind {
  PS_FAULT_DEVICE_MALLOC = 0,
  PS_FAULT_DEVICE_FREE = 1,
  PS_FAULT_HOST_ALLOC = 2,
  PS_FAULT_HOST_FREE = 3,
  PS_FAULT_COPY_H2D = 4,
  PS_FAULT_COPY_D2H = 5,
  PS_FAULT_EXECUTE = 6,
  /* Not a failure: the nth host-to-device copy succeeds, then flips one byte of its
   * destination (the middle one), to prove that checks catch a corrupted upload. */
  PS_FAULT_CORRUPT_H2D = 7,
  PS_FAULT_KIND_COUNT = 8
} ps_fault_kind;

/* One bound argument handed to a callable. */
typedef struct ps_exec_arg {
  const char* name;
  void* device_ptr;
  uint64_t bytes;
} ps_exec_arg;

typedef struct ps_platform_api {
  uint32_t api_version; /* PINSTAGE_PLATFORM_API_VERSION of the plugin's build */
  const char* name;     /* short backend name: "sim", "cuda" */

  /* Message left by the calling thread's last failed call ("" if none); never NULL. */
  const char* (*last_error)(void);

  int (*create_context)(int device_id, const ps_context_options* options, ps_device_ctx** out);
  int (*destroy_context)(ps_device_ctx* ctx);

  int (*device_malloc)(ps_device_ctx* ctx, size_t bytes, void** out);
  int (*device_free)(ps_device_ctx* ctx, void* ptr);

  /* Synchronous copies: complete when they return. */
  int (*copy_h2d)(ps_device_ctx* ctx, void* dst_device, const void* src_host, size_t bytes);
  int (*copy_d2h)(ps_device_ctx* ctx, void* dst_host, const void* src_device, size_t bytes);

  /* OPTIONAL async copies on a stream, ordered per stream; events mark completion. */
  int (*stream_create)(ps_device_ctx* ctx, ps_stream** out);
  int (*stream_destroy)(ps_device_ctx* ctx, ps_stream* stream);
  int (*stream_sync)(ps_device_ctx* ctx, ps_stream* stream);
  int (*copy_h2d_async)(ps_device_ctx* ctx, void* dst_device, const void* src_host, size_t bytes,
                        ps_stream* stream);
  int (*copy_d2h_async)(ps_device_ctx* ctx, void* dst_host, const void* src_device, size_t bytes,
                        ps_stream* stream);
  int (*event_create)(ps_device_ctx* ctx, ps_event** out);
  int (*event_destroy)(ps_device_ctx* ctx, ps_event* event);
  int (*event_record)(ps_device_ctx* ctx, ps_event* event, ps_stream* stream);
  int (*event_sync)(ps_device_ctx* ctx, ps_event* event);

  /* Pinned (page-locked where possible) host memory owned by the backend. */
  int (*host_alloc_pinned)(ps_device_ctx* ctx, size_t bytes, void** out);
  int (*host_free_pinned)(ps_device_ctx* ctx, void* ptr);

  /* OPTIONAL: lock existing host memory for fast transfers, and undo it. */
  int (*host_register)(ps_device_ctx* ctx, void* ptr, size_t bytes);
  int (*host_unregister)(ps_device_ctx* ctx, void* ptr);

  /* Device memory: what the context may commit, and what it has committed now. */
  int (*mem_info)(ps_device_ctx* ctx, uint64_t* capacity_bytes, uint64_t* committed_bytes);
  int (*get_capabilities)(ps_device_ctx* ctx, ps_capabilities* out);

  /* OPTIONAL: run the named callable on bound device memory. PS_ERR_NOT_FOUND when the
   * backend has no callable of that name. */
  int (*execute)(ps_device_ctx* ctx, const char* callable, const ps_exec_arg* args, size_t n_args);

  /* OPTIONAL (tests): make the nth (1-based) future call of a kind fail with
   * PS_ERR_INJECTED_FAULT; nth = 0 clears the fault for that kind. */
  int (*inject_fault)(ps_device_ctx* ctx, int kind, uint64_t nth);
} ps_platform_api;

typedef const ps_platform_api* (*ps_platform_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_PLATFORM_ABI_H */
