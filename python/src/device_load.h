// The device load as Python holds it (pinstage.load_to_device's result): checkpoint.cpp
// makes it, device.cpp gives it typed torch views (tensor(name)). A ViewHolder: its views
// are counted, so close() and the worker's finalize() refuse while a tensor of it lives,
// naming the tensor (finalize()'s refusal).
#pragma once

#include <string>
#include <utility>

#include "common.h"
#include "pinstage/checkpoint.h"

namespace pinstage::python {

struct PyDeviceLoad : ViewHolder {
  py::object worker_obj;  // declared first: released last
  PyWorker* worker = nullptr;
  DeviceLoad load;
  // sim only: its device memory is host RAM, backed (faulted in) the first time a block is
  // used, inside device_malloc, so inside the load's alloc_s. The pool's backed bytes and
  // backing seconds when the load began, then what this load added (note_first_touch).
  bool sim = false;
  uint64_t backed_before = 0;
  double backing_before_s = 0;
  uint64_t first_touch_bytes = 0;
  double first_touch_s = 0;

  PyDeviceLoad(py::object worker_obj_, PyWorker* worker_)
      : worker_obj(std::move(worker_obj_)), worker(worker_) {
    worker->holders.insert(this);
    start_first_touch();
  }
  PyDeviceLoad(const PyDeviceLoad&) = delete;
  PyDeviceLoad& operator=(const PyDeviceLoad&) = delete;
  ~PyDeviceLoad() override { worker->holders.erase(this); }
  std::string holder_name() const override { return "DeviceLoad"; }

  // Frees the device memory now; BufferError naming the tensors while views of it live.
  void close();
  // sim: the pool's backing figures now (start) and what the load added (note, after it).
  void start_first_touch();
  void note_first_touch();
  // The load's report dict, with device_first_touch_{bytes,s,reason} on sim.
  py::dict report() const;
};

// DeviceLoad.tensor(name) and the other view methods (device.cpp), on checkpoint.cpp's class.
void bind_device_load_views(py::class_<PyDeviceLoad>& cls);

}  // namespace pinstage::python
