// The device load as Python holds it (pinstage.load_to_device's result): checkpoint.cpp
// makes it, device.cpp gives it typed torch views (tensor(name)). A ViewHolder: its views
// are counted, so close() and the worker's finalize() refuse while a tensor of it lives,
// naming the tensor (finalize()'s refusal).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common.h"
#include "pinstage/checkpoint.h"

namespace pinstage::python {

struct PyDeviceLoad : ViewHolder {
  py::object worker_obj;  // declared first: released last
  PyWorker* worker = nullptr;
  DeviceLoad load;  // its report has sim's first-touch split (LoadReport)
  mutable std::unordered_map<std::string_view, size_t> index;  // find(); cleared by close()

  PyDeviceLoad(py::object worker_obj_, PyWorker* worker_)
      : worker_obj(std::move(worker_obj_)), worker(worker_) {
    worker->holders.insert(this);
  }
  PyDeviceLoad(const PyDeviceLoad&) = delete;
  PyDeviceLoad& operator=(const PyDeviceLoad&) = delete;
  ~PyDeviceLoad() override { worker->holders.erase(this); }
  std::string holder_name() const override { return "DeviceLoad"; }

  // Frees the device memory now; BufferError naming the tensors while views of it live.
  void close();
  // The tensor `name`, or null (an index made on first use: a state dict asks for every
  // name, and a load may hold 70,000).
  const DeviceTensor* find(const std::string& name) const;
};

// DeviceLoad.tensor(name) and the other view methods (device.cpp), on checkpoint.cpp's class.
void bind_device_load_views(py::class_<PyDeviceLoad>& cls);

}  // namespace pinstage::python
