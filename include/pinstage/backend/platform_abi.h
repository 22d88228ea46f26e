/* pinstage platform ABI: the C contract between the runtime and a backend plugin.
 * The plugin SDK is this folder (include/pinstage/backend/); docs/design/plugin-abi.md
 * is the prose version and Note [One allocation table] in src/runtime/ explains who owns
 * what.
 *
 * A plugin is a shared object that exports one symbol, PINSTAGE_PLATFORM_ENTRY_SYMBOL,
 * returning a pointer to a static ps_platform_api table. The runtime dlopens the plugin
 * once per process, checks api_version, and resolves the table once (no dlsym per call).
 *
 * Rules every plugin follows:
 *  - Every slot except create_context/last_error/get_proc_address takes the opaque device
 *    context first, so a call always runs against the worker's own device.
 *  - Every slot returns a ps_status (0 on success, a negative code otherwise), null-checks
 *    its arguments and catches every exception (nothing unwinds through C).
 *  - On failure a slot may leave a detail message for the calling thread, read through
 *    last_error (for example the CUDA driver's error string).
 *  - A backend keeps no table of its allocations, streams or events. The runtime's one
 *    table records every ps_allocation and handle a slot returns, checks every pointer
 *    and range before a slot sees it, and hands each back exactly once to the matching
 *    free/destroy slot. Whatever a backend needs to release an allocation travels in
 *    ps_allocation.handle.
 *  - destroy_context runs after the runtime has destroyed every stream and event and
 *    freed every allocation of the context: it releases only the context itself.
 *  - Slots marked OPTIONAL may be NULL; the runtime then supplies the default
 *    (synchronous copies for the async slots, "unsupported" for the rest).
 *
 * Version history: v4 added the copy flags (PS_COPY_HOST_PINNED) and event_query; v5
 * appends copy_d2d_async and memset_async at the table's end, so no older slot moves; v6
 * appends device_count and device_props (the devices and their topology) and
 * ps_context_options.host_numa_node (where the context's pinned memory is placed); v7
 * appends host_register and host_unregister: the runtime makes host memory (fresh
 * anonymous pages, a read-only file mapping, a tmpfs segment) and the plugin only pins it
 * (Note [Segment sources] in src/runtime/host_memory/); v8 makes that the rule: the runtime
 * makes, places and faults every pinned byte, host_alloc_pinned/host_free_pinned become an
 * optional pair (the vendor source, taken only where host_register is missing or refuses
 * anonymous memory), and a plugin has at least one of the two pairs.
 */
#ifndef PINSTAGE_PLATFORM_ABI_H
#define PINSTAGE_PLATFORM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to the table's layout or to a slot's meaning. */
#define PINSTAGE_PLATFORM_API_VERSION 8u
#define PINSTAGE_PLATFORM_ENTRY_SYMBOL "pinstage_platform_entry"
/* Marks the entry symbol: plugins build with hidden visibility and export only it. */
#define PINSTAGE_PLUGIN_EXPORT __attribute__((visibility("default")))

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
  PS_ERR_INTERNAL = -10,        /* an exception or broken invariant inside the plugin */
  PS_ERR_NOT_READY = -11        /* event_query: the work before the event is still queued */
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
    case PS_ERR_NOT_READY:
      return "PS_ERR_NOT_READY";
    default:
      return "PS_ERR_UNKNOWN_STATUS";
  }
}

typedef struct ps_device_ctx ps_device_ctx; /* opaque, owned by the plugin */
typedef struct ps_stream ps_stream;         /* opaque copy queue (a CUDA stream) */
typedef struct ps_event ps_event;           /* opaque completion marker on a stream */

/* One backend setting ("pinned_mode" = "register"). Keys are unique within a context. */
typedef struct ps_config_entry {
  const char* key;
  const char* value;
} ps_config_entry;

typedef struct ps_context_options {
  /* Device memory the context may commit; 0 = the backend's default. */
  uint64_t device_capacity_bytes;
  /* Backend-specific settings; a backend refuses a key it does not know. */
  const ps_config_entry* config;
  size_t config_count;
  /* (ABI v6) The host NUMA node the context's pinned memory is placed on (bound before
   * its first touch); -1 = none, the kernel's choice. The runtime passes only a node
   * that exists on this host. A zeroed struct means node 0: fill it in. */
  int host_numa_node;
} ps_context_options;

/* (ABI v6) One device as the backend sees it, without a context. Strings are
 * NUL-terminated and cut to fit. */
#define PS_DEVICE_NAME_MAX 128
#define PS_DEVICE_PCI_ID_MAX 32
#define PS_DEVICE_REASON_MAX 256
typedef struct ps_device_props {
  char name[PS_DEVICE_NAME_MAX];         /* "NVIDIA H200", "sim device 1" */
  char pci_bus_id[PS_DEVICE_PCI_ID_MAX]; /* "0000:3b:00.0" (lower case); "" when none */
  uint64_t memory_bytes;                 /* the device's memory; 0 = unknown */
  int numa_node;                         /* host NUMA node nearest the device; -1 = unknown */
  int usable;                            /* 1 when a context can be created on it now */
  char reason[PS_DEVICE_REASON_MAX];     /* why not usable; "" when usable */
} ps_device_props;

typedef struct ps_capabilities {
  int pinned_is_page_locked; /* 1 when pinned host memory is really locked in RAM */
  int async_copy;            /* 1 when async copies overlap with host work */
  int execute;               /* 1 when the backend runs host callables (host_execute) */
  /* 1 when device memory is ordinary host RAM (sim): sizing must count it against the
   * host's memory, a host-to-"device" copy is a memcpy, and host callables can run on
   * device pointers in place. */
  int device_memory_is_host;
} ps_capabilities;

/* The operation kinds the fault hook can fail: the one list. X(ENUM_SUFFIX, name).
 * corrupt_h2d is not a failure: the nth host-to-device copy succeeds, then flips one byte
 * of its destination (the middle one), to prove that checks catch a corrupted upload. */
#define PS_FAULT_KIND_LIST(X)     \
  X(DEVICE_MALLOC, device_malloc) \
  X(DEVICE_FREE, device_free)     \
  X(HOST_ALLOC, host_alloc)       \
  X(HOST_FREE, host_free)         \
  X(COPY_H2D, copy_h2d)           \
  X(COPY_D2H, copy_d2h)           \
  X(EXECUTE, execute)             \
  X(CORRUPT_H2D, corrupt_h2d)

typedef enum ps_fault_kind {
#define PS_FAULT_ENUM_(E, n) PS_FAULT_##E,
  PS_FAULT_KIND_LIST(PS_FAULT_ENUM_)
#undef PS_FAULT_ENUM_
      PS_FAULT_KIND_COUNT
} ps_fault_kind;

/* "device_malloc", ...; NULL for a value outside the list. */
static inline const char* ps_fault_kind_name(int kind) {
  static const char* const names[] = {
#define PS_FAULT_NAME_(E, n) #n,
      PS_FAULT_KIND_LIST(PS_FAULT_NAME_)
#undef PS_FAULT_NAME_
  };
  return kind >= 0 && kind < PS_FAULT_KIND_COUNT ? names[kind] : NULL; /* NOLINT: C header */
}

/* One allocation as the runtime records it. A backend fills ptr and, when it needs
 * more than (ptr, bytes) to release it, handle; the runtime passes the same record back
 * to the free slot exactly once. */
typedef struct ps_allocation {
  void* ptr;
  size_t bytes; /* as requested */
  void* handle; /* backend-private; NULL when not needed */
} ps_allocation;

/* Copy flags (ABI v4). PS_COPY_HOST_PINNED: the host side lies inside one live pinned
 * allocation of this context, as the runtime's one table of pinned ranges says. A backend
 * picks its copy path from this flag and keeps no pinned list of its own. */
#define PS_COPY_HOST_PINNED 1u

/* host_register flags (ABI v7). PS_REGISTER_READ_ONLY: the range is mapped read-only (a
 * checkpoint file's page cache); the device only reads it (cudaHostRegisterReadOnly). */
#define PS_REGISTER_READ_ONLY 1u
/* (ABI v8) PS_REGISTER_ON_FAULT: the range is not faulted in yet (its writers fault it
 * after this call, a load's readers chunk by chunk): pin each page as it faults in, and the
 * pages present now at once (sim: mlock2 MLOCK_ONFAULT), so pinning costs no pass of its
 * own. A backend that can only pin present pages answers PS_ERR_UNSUPPORTED, and the
 * runtime registers the range once it is written. */
#define PS_REGISTER_ON_FAULT 2u

/* A host callable run by host_execute; returns a ps_status. */
typedef int (*ps_host_fn)(void* user);

typedef struct ps_platform_api {
  uint32_t api_version; /* PINSTAGE_PLATFORM_API_VERSION of the plugin's build */
  const char* name;     /* short backend name: "sim", "cuda" */

  /* Message left by the calling thread's last failed call ("" if none); never NULL. */
  const char* (*last_error)(void);
  /* OPTIONAL: an extension function by name ("cuda.pin_stats"), or NULL when the
   * backend has none of that name. The extension's header documents its signature. */
  void* (*get_proc_address)(const char* name);

  int (*create_context)(int device_id, const ps_context_options* options, ps_device_ctx** out);
  /* Releases the context only (see the rules above). */
  int (*destroy_context)(ps_device_ctx* ctx);

  /* Device memory. The runtime checks capacity-independent arguments (bytes > 0). */
  int (*device_malloc)(ps_device_ctx* ctx, size_t bytes, ps_allocation* out);
  int (*device_free)(ps_device_ctx* ctx, const ps_allocation* allocation);

  /* Synchronous copies: complete when they return. The runtime has checked that the
   * device side lies inside one live device allocation of this context; `flags` holds
   * PS_COPY_HOST_PINNED when the host side is this context's pinned memory. */
  int (*copy_h2d)(ps_device_ctx* ctx, void* dst_device, const void* src_host, size_t bytes,
                  uint32_t flags);
  int (*copy_d2h)(ps_device_ctx* ctx, void* dst_host, const void* src_device, size_t bytes,
                  uint32_t flags);

  /* OPTIONAL async copies on a stream, ordered per stream; events mark completion.
   * All ten (event_query below included) are present or all NULL. */
  int (*stream_create)(ps_device_ctx* ctx, ps_stream** out);
  int (*stream_destroy)(ps_device_ctx* ctx, ps_stream* stream); /* waits for its work */
  int (*stream_sync)(ps_device_ctx* ctx, ps_stream* stream);
  int (*copy_h2d_async)(ps_device_ctx* ctx, void* dst_device, const void* src_host, size_t bytes,
                        uint32_t flags, ps_stream* stream);
  int (*copy_d2h_async)(ps_device_ctx* ctx, void* dst_host, const void* src_device, size_t bytes,
                        uint32_t flags, ps_stream* stream);
  int (*event_create)(ps_device_ctx* ctx, ps_event** out);
  int (*event_destroy)(ps_device_ctx* ctx, ps_event* event);
  int (*event_record)(ps_device_ctx* ctx, ps_event* event, ps_stream* stream);
  int (*event_sync)(ps_device_ctx* ctx, ps_event* event);

  /* OPTIONAL pair (v8): the plugin's own pinned (page-locked where possible) host memory,
   * never rounded past the page: the vendor source, which the runtime takes only where
   * host_register is missing or answers PS_ERR_UNSUPPORTED for anonymous memory. The
   * runtime makes, places and faults every other pinned byte itself. */
  int (*host_alloc_pinned)(ps_device_ctx* ctx, size_t bytes, ps_allocation* out);
  int (*host_free_pinned)(ps_device_ctx* ctx, const ps_allocation* allocation);

  /* Device memory: what the context may commit, and what it has committed now. */
  int (*mem_info)(ps_device_ctx* ctx, uint64_t* capacity_bytes, uint64_t* committed_bytes);
  int (*get_capabilities)(ps_device_ctx* ctx, ps_capabilities* out);

  /* OPTIONAL, for backends whose device memory is host memory: runs fn(user) as the
   * device's execute step (the EXECUTE fault applies) and returns its status. The
   * runtime provides the callables (Note [Host callables] in src/runtime/). */
  int (*host_execute)(ps_device_ctx* ctx, ps_host_fn fn, void* user);

  /* OPTIONAL (tests): make the nth (1-based) future call of a kind fail with
   * PS_ERR_INJECTED_FAULT; nth = 0 clears the fault for that kind. */
  int (*inject_fault)(ps_device_ctx* ctx, int kind, uint64_t nth);

  /* Async set (ABI v4): PS_OK when the work queued before `event`'s last record has
   * completed (or it was never recorded), PS_ERR_NOT_READY while it is still queued,
   * never blocking. The host memory pool asks it before it hands out a block again that a
   * queued copy may still read (Note [Host memory pool] in src/runtime/host_memory/). */
  int (*event_query)(ps_device_ctx* ctx, ps_event* event);

  /* OPTIONAL device-side slots (ABI v5), each independent of every other: NULL means the
   * backend lacks the operation and the runtime says so (Error(unsupported)); there is
   * no fallback through the host. Queued on `stream` in its order; a NULL stream (the
   * synchronous forms, or a backend without the async set) means the work is complete
   * when the slot returns. The runtime has checked that every range lies inside one live
   * device allocation of this context, that bytes > 0, and that the two ranges of a copy
   * do not overlap (they may lie in the same allocation). */
  int (*copy_d2d_async)(ps_device_ctx* ctx, void* dst_device, const void* src_device, size_t bytes,
                        ps_stream* stream);
  /* Sets `bytes` device bytes to (unsigned char)value; the runtime passes 0..255 only. */
  int (*memset_async)(ps_device_ctx* ctx, void* dst_device, int value, size_t bytes,
                      ps_stream* stream);

  /* OPTIONAL topology slots (ABI v6), both present or both NULL; neither needs a
   * context. `options` is the configuration a context would get (sim reads devices= and
   * numa_nodes= from it; may be NULL). NULL slots mean one device, id 0, whose
   * properties are unknown. device_count sets *out to the number of devices; where there
   * is no driver, or it sees no device, it may instead fail with PS_ERR_NO_DEVICE and the
   * reason in last_error() (cuda, acl: the text create_context would give); device_props
   * fills `out` for a device id in [0, count). */
  int (*device_count)(const ps_context_options* options, int* out);
  int (*device_props)(int device_id, const ps_context_options* options, ps_device_props* out);

  /* OPTIONAL pinning slots (ABI v7), both present or both NULL; a plugin without them must
   * have host_alloc_pinned. host_register pins host memory the runtime mapped itself
   * (placed on its NUMA node, faulted, on huge pages where the runtime chose them), in
   * place: [ptr, ptr + bytes) is page-aligned,
   * bytes > 0, and no part of it is registered already. On PS_OK the range is page-locked
   * (or device-registered) until host_unregister gets the same ptr and bytes, exactly
   * once; on failure nothing of it stays registered. `flags`: PS_REGISTER_READ_ONLY,
   * PS_REGISTER_ON_FAULT (v8), or 0.
   * sim: mlock/munlock; cuda: cudaHostRegister in pieces; acl: aclrtHostRegister, whole
   * (a copy must lie inside one registration: the runtime registers a segment or a file
   * mapping as one range). A backend that cannot register this kind of memory fails with
   * PS_ERR_UNSUPPORTED and the reason in last_error; the runtime then takes another
   * source (anonymous memory: the vendor's; a read-only file mapping: a private writable
   * copy; failing that, a copy into memory it can pin), and says so. */
  int (*host_register)(ps_device_ctx* ctx, void* ptr, size_t bytes, uint32_t flags);
  int (*host_unregister)(ps_device_ctx* ctx, void* ptr, size_t bytes);
} ps_platform_api;

typedef const ps_platform_api* (*ps_platform_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_PLATFORM_ABI_H */
