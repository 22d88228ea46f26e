/* The control side of the libascendcl test double (fake_ascendcl.cpp): what tests call, on
 * top of the ACL symbols the double exports. Tests reach these functions through
 * FakeAcl (tests/cpp/acl_test_util.h), which dlopens the same library the plugin loads.
 *
 * Every rule the double enforces answers with a specific ACL error code AND records a
 * violation of one of these kinds, which tests read back afterwards. */
#ifndef PINSTAGE_FAKE_ACL_H
#define PINSTAGE_FAKE_ACL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(ENUM_SUFFIX, "text"): the one list of rules. */
#define FAKE_ACL_VIOLATION_LIST(X)                                                   \
  X(UNINITIALIZED, "runtime call before aclInit or after aclFinalize")               \
  X(NO_CONTEXT, "runtime call on a thread with no current (live) context")           \
  X(BAD_HANDLE, "unknown context, stream or event handle")                           \
  X(COPY_OVERFLOW, "copy count exceeds destMax")                                     \
  X(COPY_OUTSIDE, "copy leaves a known allocation")                                  \
  X(DESTMAX_OVERSTATED, "destMax is more than the room left in the destination")     \
  X(ASYNC_PAGEABLE, "aclrtMemcpyAsync with pageable host memory")                    \
  X(WRONG_DEVICE, "device memory used from a context of another device")             \
  X(REGISTER_UNALIGNED, "aclrtHostRegister of a pointer that is not page-aligned")   \
  X(REGISTER_OVERLAP, "aclrtHostRegister over memory already registered or pinned")  \
  X(UNREGISTER_UNKNOWN, "aclrtHostUnregister of memory that is not registered")      \
  X(FREE_UNKNOWN, "free of a pointer the runtime did not give")                      \
  X(FREEHOST_NOT_MALLOCHOST, "aclrtFreeHost of memory aclrtMallocHost did not give") \
  X(FREE_IN_USE, "release of memory a queued async copy still uses")                 \
  X(RESET_WITH_LIVE,                                                                 \
    "aclrtResetDevice with live allocations, streams, events or contexts "           \
    "(the card would hang)")                                                         \
  X(LEAK_AT_FINALIZE, "aclFinalize with objects still alive")                        \
  X(COPY_OVERLAP, "device-to-device copy between overlapping ranges")                \
  X(HOST_SIDE_ON_DEVICE, "the host side of a copy is device memory (wrong memcpy kind)")

typedef enum fake_acl_violation {
#define FAKE_ACL_ENUM_(E, text) FAKE_ACL_##E,
  FAKE_ACL_VIOLATION_LIST(FAKE_ACL_ENUM_)
#undef FAKE_ACL_ENUM_
      FAKE_ACL_VIOLATION_COUNT
} fake_acl_violation;

/* What is alive in the double (for one device, or all with device = -1). */
typedef struct fake_acl_live {
  uint64_t host_allocs;   /* aclrtMallocHost blocks */
  uint64_t registrations; /* aclrtHostRegister ranges */
  uint64_t device_allocs; /* aclrtMalloc blocks */
  uint64_t streams, events, contexts;
  uint64_t device_refs;  /* aclrtSetDevice not yet reset */
  uint64_t locked_bytes; /* against the memlock limit */
  int initialized;
} fake_acl_live;

/* Model: device count, memory per device, memlock-style host limit (0 = none), whether
 * aclrtHostRegister is supported (else ACL_ERROR_RT_FEATURE_NOT_SUPPORT). Defaults come
 * from PINSTAGE_FAKE_ACL_DEVICES (2), PINSTAGE_FAKE_ACL_MEM_MB (8192),
 * PINSTAGE_FAKE_ACL_MEMLOCK_MB (0) and PINSTAGE_FAKE_ACL_REGISTER (1). */
typedef void (*fake_acl_configure_fn)(int devices, uint64_t device_bytes, uint64_t memlock_bytes,
                                      int register_supported);
/* Models one device (until the next configure): its memory (0 = the configured size) and
 * the error aclrtSetDevice of it answers with (0 = none; a card that will not open). */
typedef void (*fake_acl_set_device_fn)(int device, uint64_t device_bytes, int set_device_error);
/* Clears violations, the trace, injected failures and call counts (not live objects). */
typedef void (*fake_acl_reset_fn)(void);
/* Violations recorded, of one kind (kind = -1: all). */
typedef uint64_t (*fake_acl_violations_fn)(int kind);
/* The text of violation `index` (in order), or NULL; valid until the next reset. */
typedef const char* (*fake_acl_violation_text_fn)(uint64_t index);
/* The nth (1-based) next call of `function` fails with `code` (once); nth 0 clears. */
typedef int (*fake_acl_fail_nth_fn)(const char* function, uint64_t nth, int code);
/* Calls of `function` since the last reset. */
typedef uint64_t (*fake_acl_calls_fn)(const char* function);
/* The trace: every call's name and result ("aclrtFree=0"), when turned on. */
typedef void (*fake_acl_trace_on_fn)(int on);
typedef uint64_t (*fake_acl_trace_size_fn)(void);
typedef const char* (*fake_acl_trace_at_fn)(uint64_t index);
typedef void (*fake_acl_live_fn)(int device, fake_acl_live* out);
/* What the double holds [ptr, ptr + bytes) as: FAKE_ACL_PINNED_MALLOC_HOST or
 * FAKE_ACL_PINNED_REGISTERED when the range lies inside one such block, else
 * FAKE_ACL_PINNED_NONE (a test's view of what was pinned, not the backend's). */
typedef enum fake_acl_pinned_kind {
  FAKE_ACL_PINNED_NONE = 0,
  FAKE_ACL_PINNED_MALLOC_HOST = 1,
  FAKE_ACL_PINNED_REGISTERED = 2
} fake_acl_pinned_kind;
typedef int (*fake_acl_pinned_fn)(const void* ptr, uint64_t bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PINSTAGE_FAKE_ACL_H */
