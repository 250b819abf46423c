// The CUDA driver, loaded at run time, and the registry of saturn devices.
//
// Index 0 is the CPU reference device and always exists. Indices 1..n are the
// GPUs in driver order (saturn:k is CUDA ordinal k-1), found on first use through
// libcuda loaded with dlopen, so building needs no CUDA toolkit and a machine with
// no driver still has index 0.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace saturn {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;

// Number of saturn devices: 1 + number of usable GPUs. Never throws.
c10::DeviceIndex device_count() noexcept;
// Number of usable GPUs (0 when the driver is missing, old, or finds none).
int gpu_count() noexcept;
// Why there are no GPUs ("" when there are some).
const std::string& gpu_unavailable_reason() noexcept;

inline bool is_gpu(c10::DeviceIndex index) { return index >= 1; }

// Raises a clear error when `index` names no saturn device.
void check_index(c10::DeviceIndex index);

// Makes the GPU's primary context current on this thread (no-op for index 0).
void make_current(c10::DeviceIndex index);
// The one stream all of saturn's work on a GPU is queued on.
CUstream stream(c10::DeviceIndex index);
void synchronize(c10::DeviceIndex index);

// Raw driver calls, each checked: failures raise with CUDA's error name and text.
CUdeviceptr mem_alloc(c10::DeviceIndex index, size_t bytes, bool* out_of_memory);
void mem_free(c10::DeviceIndex index, CUdeviceptr ptr);
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* ptr);
void copy_h2d(c10::DeviceIndex index, CUdeviceptr dst, const void* src, size_t bytes);
void copy_d2h(c10::DeviceIndex index, void* dst, CUdeviceptr src, size_t bytes);
void copy_d2d(c10::DeviceIndex index, CUdeviceptr dst, CUdeviceptr src, size_t bytes);
void copy_peer(c10::DeviceIndex dst_index, CUdeviceptr dst, c10::DeviceIndex src_index,
               CUdeviceptr src, size_t bytes);
void mem_info(c10::DeviceIndex index, size_t* free_bytes, size_t* total_bytes);
std::string device_name(c10::DeviceIndex index);

// CUDA events on a GPU's stream (resolved apart from the entry points above: a driver
// without them still runs everything else, and these raise).
void* event_create(c10::DeviceIndex index, bool timing);
void event_record(c10::DeviceIndex index, void* event);
void event_destroy(c10::DeviceIndex index, void* event) noexcept;
bool event_query(c10::DeviceIndex index, void* event);
void event_synchronize(c10::DeviceIndex index, void* event);
void stream_wait_event(c10::DeviceIndex index, void* event);
bool stream_query(c10::DeviceIndex index);  // whether the stream's work has finished
float event_elapsed_ms(c10::DeviceIndex index, void* start, void* end);
int compute_capability(c10::DeviceIndex index);

}  // namespace saturn
