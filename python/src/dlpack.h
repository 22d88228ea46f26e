// The DLPack ABI (v0.x, the unversioned layout PyTorch 1.13 and NumPy consume), written
// from the public specification: only what the exporter needs. Capsules are named
// "dltensor"; a consumer renames the capsule it took to "used_dltensor".
#pragma once

#include <cstdint>

namespace pinstage::python {

enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory of a CUDA context
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
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

inline constexpr const char* kDLTensorCapsuleName = "dltensor";
inline constexpr const char* kDLTensorUsedCapsuleName = "used_dltensor";

}  // namespace pinstage::python
