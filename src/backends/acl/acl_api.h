// The few Ascend runtime (libascendcl) declarations the acl backend uses, written from
// the public facts about CANN's C API (acl/acl_base.h, acl/acl_rt.h). No CANN header is
// included: the library is dlopened at run time (acl_runtime.h) and these are the
// signatures its symbols are called through. The test double (tests/fakes/ascendcl)
// includes this header too, so both sides agree on every prototype.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pinstage::acl {

using aclError = int;
using aclrtContext = void*;
using aclrtStream = void*;
using aclrtEvent = void*;

// aclrtMemcpyKind, in CANN's order.
enum aclrtMemcpyKind : int {
  ACL_MEMCPY_HOST_TO_HOST = 0,
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
  ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
};

// aclrtMemMallocPolicy: huge pages first, normal pages when none are left.
enum aclrtMemMallocPolicy : int { ACL_MEM_MALLOC_HUGE_FIRST = 0 };

// aclrtMemAttr: which device memory aclrtGetMemInfo reports.
enum aclrtMemAttr : int { ACL_DDR_MEM = 0, ACL_HBM_MEM = 1 };

// The error codes the backend names or reacts to. X(NAME, value): the one list, so the
// name table (acl_error_name) cannot drift from the values.
#define PINSTAGE_ACL_ERROR_LIST(X)            \
  X(ACL_SUCCESS, 0)                           \
  X(ACL_ERROR_INVALID_PARAM, 100000)          \
  X(ACL_ERROR_UNINITIALIZE, 100001)           \
  X(ACL_ERROR_REPEAT_INITIALIZE, 100002)      \
  X(ACL_ERROR_RT_PARAM_INVALID, 107000)       \
  X(ACL_ERROR_RT_INVALID_DEVICEID, 107001)    \
  X(ACL_ERROR_RT_CONTEXT_NULL, 107002)        \
  X(ACL_ERROR_BAD_ALLOC, 200000)              \
  X(ACL_ERROR_API_NOT_SUPPORT, 200001)        \
  X(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, 207000) \
  X(ACL_ERROR_RT_MEMORY_ALLOCATION, 207001)   \
  X(ACL_ERROR_RT_MEMORY_FREE, 207002)         \
  X(ACL_ERROR_RT_NO_DEVICE, 207004)           \
  X(ACL_ERROR_INTERNAL_ERROR, 500000)         \
  X(ACL_ERROR_RT_DRV_INTERNAL_ERROR, 507899)

enum AclErrorCode : aclError {
#define PINSTAGE_ACL_ENUM_(name, value) name = value,
  PINSTAGE_ACL_ERROR_LIST(PINSTAGE_ACL_ENUM_)
#undef PINSTAGE_ACL_ENUM_
};

// "ACL_ERROR_RT_CONTEXT_NULL" for a known code, "unknown ACL error" otherwise.
const char* acl_error_name(aclError code) noexcept;

// The functions, as the library exports them (extern "C" symbols of these names).
// X(name, return type, parameter list).
#define PINSTAGE_ACL_FUNCTION_LIST(X)                                                 \
  X(aclInit, aclError, (const char* configPath))                                      \
  X(aclFinalize, aclError, ())                                                        \
  X(aclrtGetDeviceCount, aclError, (uint32_t * count))                                \
  X(aclrtSetDevice, aclError, (int32_t deviceId))                                     \
  X(aclrtResetDevice, aclError, (int32_t deviceId))                                   \
  X(aclrtCreateContext, aclError, (aclrtContext * context, int32_t deviceId))         \
  X(aclrtDestroyContext, aclError, (aclrtContext context))                            \
  X(aclrtSetCurrentContext, aclError, (aclrtContext context))                         \
  X(aclrtCreateStream, aclError, (aclrtStream * stream))                              \
  X(aclrtDestroyStream, aclError, (aclrtStream stream))                               \
  X(aclrtSynchronizeStream, aclError, (aclrtStream stream))                           \
  X(aclrtCreateEvent, aclError, (aclrtEvent * event))                                 \
  X(aclrtRecordEvent, aclError, (aclrtEvent event, aclrtStream stream))               \
  X(aclrtSynchronizeEvent, aclError, (aclrtEvent event))                              \
  X(aclrtDestroyEvent, aclError, (aclrtEvent event))                                  \
  X(aclrtMallocHost, aclError, (void** hostPtr, size_t size))                         \
  X(aclrtFreeHost, aclError, (void* hostPtr))                                         \
  X(aclrtMalloc, aclError, (void** devPtr, size_t size, aclrtMemMallocPolicy policy)) \
  X(aclrtFree, aclError, (void* devPtr))                                              \
  X(aclrtMemcpy, aclError,                                                            \
    (void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind)) \
  X(aclrtMemcpyAsync, aclError,                                                       \
    (void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,  \
     aclrtStream stream))                                                             \
  X(aclrtGetMemInfo, aclError, (aclrtMemAttr attr, size_t * free, size_t * total))    \
  X(aclrtHostRegister, aclError, (void* ptr, uint64_t size, int type, void** devPtr)) \
  X(aclrtHostUnregister, aclError, (void* ptr))

// aclGetRecentErrMsg is looked up separately: older runtimes lack it.
using aclGetRecentErrMsg_fn = const char* (*)();
// So is aclrtMemsetAsync (CANN's "memory management" API; not in the facts every
// runtime was checked against): a runtime without it still loads, and only a device
// fill is then unsupported.
using aclrtMemsetAsync_fn = aclError (*)(void* devPtr, size_t maxCount, int32_t value, size_t count,
                                         aclrtStream stream);

}  // namespace pinstage::acl
