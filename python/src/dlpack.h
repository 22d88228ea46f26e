// The DLPack ABI, written from the public specification: only what the exporter needs.
// Two layouts: the unversioned DLManagedTensor (v0.x, capsule "dltensor", what PyTorch
// 1.13 and NumPy < 2.1 consume) and DLPack 1.0's DLManagedTensorVersioned (capsule
// "dltensor_versioned", with a version and flags), given to a consumer that passes
// max_version >= (1, 0). A consumer renames the capsule it took to "used_" + the name.
#pragma once

#include <cstdint>

namespace pinstage::python {

enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory of a CUDA context
  kDLExtDev = 12,   // the spec's extension device: DLPack names no Ascend NPU (acl)
};

struct DLDevice {
  int32_t device_type;  // DLDeviceType
  int32_t device_id;
};

enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
};

struct DLDataType {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // always set (row-major): DLPack 1.0 no longer allows null
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;  // kDLFlag*
  DLTensor dl_tensor;
};

inline constexpr uint64_t kDLFlagReadOnly = 1ULL << 0;
inline constexpr uint64_t kDLFlagIsCopied = 1ULL << 1;
inline constexpr uint32_t kDLPackMajorVersion = 1;  // the version exported
inline constexpr uint32_t kDLPackMinorVersion = 0;

inline constexpr const char* kDLTensorCapsuleName = "dltensor";
inline constexpr const char* kDLTensorUsedCapsuleName = "used_dltensor";
inline constexpr const char* kDLTensorVersionedCapsuleName = "dltensor_versioned";

}  // namespace pinstage::python
