#include "driver.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <cstdlib>
#include <deque>
#include <mutex>

namespace saturn {
namespace {

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr int kMinDriverVersion = 12000;  // CUDA 12.0: what numba-cuda and nvmath need
constexpr unsigned kStreamNonBlocking = 1;
constexpr int kAttrComputeMajor = 75;
constexpr int kAttrComputeMinor = 76;

// The driver entry points saturn uses, resolved once with dlsym.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyPeer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  // events: optional (see event_create)
  CUresult (*cuEventCreate)(void**, unsigned) = nullptr;
  CUresult (*cuEventRecord)(void*, CUstream) = nullptr;
  CUresult (*cuEventQuery)(void*) = nullptr;
  CUresult (*cuEventSynchronize)(void*) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, void*, void*) = nullptr;
  CUresult (*cuEventDestroy)(void*) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, void*, unsigned) = nullptr;
  CUresult (*cuStreamQuery)(CUstream) = nullptr;
};

struct Gpu {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  std::once_flag stream_once;
};

struct Registry {
  Driver api{};
  std::deque<Gpu> gpus;  // deque: Gpu holds a once_flag and cannot move
  std::string reason;
};

template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

Registry* discover() {
  auto* r = new Registry();
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    const char* err = dlerror();
    r->reason = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") +
                (err ? err : "unknown dlopen error");
    return r;
  }
  Driver& d = r->api;
  bool ok = resolve(lib, "cuInit", &d.cuInit) &&
            resolve(lib, "cuDriverGetVersion", &d.cuDriverGetVersion) &&
            resolve(lib, "cuGetErrorName", &d.cuGetErrorName) &&
            resolve(lib, "cuGetErrorString", &d.cuGetErrorString) &&
            resolve(lib, "cuDeviceGetCount", &d.cuDeviceGetCount) &&
            resolve(lib, "cuDeviceGet", &d.cuDeviceGet) &&
            resolve(lib, "cuDeviceGetName", &d.cuDeviceGetName) &&
            resolve(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute) &&
            resolve(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) &&
            resolve(lib, "cuCtxSetCurrent", &d.cuCtxSetCurrent) &&
            resolve(lib, "cuStreamCreate", &d.cuStreamCreate) &&
            resolve(lib, "cuStreamSynchronize", &d.cuStreamSynchronize) &&
            resolve(lib, "cuMemAlloc_v2", &d.cuMemAlloc) &&
            resolve(lib, "cuMemFree_v2", &d.cuMemFree) &&
            resolve(lib, "cuMemHostAlloc", &d.cuMemHostAlloc) &&
            resolve(lib, "cuMemFreeHost", &d.cuMemFreeHost) &&
            resolve(lib, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync) &&
            resolve(lib, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync) &&
            resolve(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync) &&
            resolve(lib, "cuMemcpyPeer", &d.cuMemcpyPeer) &&
            resolve(lib, "cuMemGetInfo_v2", &d.cuMemGetInfo);
  if (!ok) {
    r->reason = "the CUDA driver lacks an entry point saturn needs (driver too old)";
    return r;
  }
  resolve(lib, "cuEventCreate", &d.cuEventCreate);
  resolve(lib, "cuEventRecord", &d.cuEventRecord);
  resolve(lib, "cuEventQuery", &d.cuEventQuery);
  resolve(lib, "cuEventSynchronize", &d.cuEventSynchronize);
  resolve(lib, "cuEventElapsedTime", &d.cuEventElapsedTime);
  resolve(lib, "cuEventDestroy_v2", &d.cuEventDestroy);
  resolve(lib, "cuStreamWaitEvent", &d.cuStreamWaitEvent);
  resolve(lib, "cuStreamQuery", &d.cuStreamQuery);
  int version = 0;
  if (d.cuDriverGetVersion(&version) != CUDA_SUCCESS || version < kMinDriverVersion) {
    r->reason = "the CUDA driver is version " + std::to_string(version) +
                "; saturn needs " + std::to_string(kMinDriverVersion) + " or newer";
    return r;
  }
  CUresult rc = d.cuInit(0);
  int count = 0;
  if (rc == CUDA_SUCCESS) rc = d.cuDeviceGetCount(&count);
  if (rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(rc, &name);
    r->reason = std::string("cuInit failed: ") + (name ? name : "unknown error");
    return r;
  }
  if (count == 0) {
    r->reason = "the CUDA driver reports no GPU";
    return r;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS) break;
    r->gpus.emplace_back().device = dev;
  }
  return r;
}

Registry& registry() {
  static Registry* r = discover();  // thread-safe, once, on first use
  return *r;
}

[[noreturn]] void fail(CUresult rc, const char* call) {
  Driver& d = registry().api;
  const char* name = nullptr;
  const char* text = nullptr;
  d.cuGetErrorName(rc, &name);
  d.cuGetErrorString(rc, &text);
  TORCH_CHECK(false, "saturn: ", call, " failed: ", name ? name : "CUDA_ERROR_UNKNOWN",
              " (", text ? text : "no description", ")");
}

#define SATURN_CU(call)                      \
  do {                                       \
    CUresult rc_ = registry().api.call;      \
    if (rc_ != CUDA_SUCCESS) fail(rc_, #call); \
  } while (0)

Gpu& gpu(c10::DeviceIndex index) {
  check_index(index);
  TORCH_CHECK(is_gpu(index), "saturn:0 is the CPU reference device, not a GPU");
  return registry().gpus[index - 1];
}

}  // namespace

c10::DeviceIndex device_count() noexcept {
  return static_cast<c10::DeviceIndex>(1 + registry().gpus.size());
}

int gpu_count() noexcept { return static_cast<int>(registry().gpus.size()); }

const std::string& gpu_unavailable_reason() noexcept { return registry().reason; }

void check_index(c10::DeviceIndex index) {
  const auto n = device_count();
  if (index >= 0 && index < n) return;
  if (n == 1) {
    TORCH_CHECK_INDEX(false, "saturn:", static_cast<int>(index),
                      " does not exist: this machine has only saturn:0, the CPU reference "
                      "device (no GPU: ", registry().reason, ")");
  }
  TORCH_CHECK_INDEX(false, "saturn:", static_cast<int>(index), " does not exist: valid indices are 0..",
                    static_cast<int>(n - 1), " (0 is the CPU reference device)");
}

void make_current(c10::DeviceIndex index) {
  if (!is_gpu(index)) return;
  Gpu& g = gpu(index);
  if (g.context == nullptr) {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    if (g.context == nullptr) {
      CUcontext ctx = nullptr;
      SATURN_CU(cuDevicePrimaryCtxRetain(&ctx, g.device));
      g.context = ctx;
    }
  }
  SATURN_CU(cuCtxSetCurrent(g.context));
}

CUstream stream(c10::DeviceIndex index) {
  Gpu& g = gpu(index);
  std::call_once(g.stream_once, [&] {
    make_current(index);
    SATURN_CU(cuStreamCreate(&g.stream, kStreamNonBlocking));
  });
  return g.stream;
}

void synchronize(c10::DeviceIndex index) {
  if (!is_gpu(index)) return;
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuStreamSynchronize(s));
}

CUdeviceptr mem_alloc(c10::DeviceIndex index, size_t bytes, bool* out_of_memory) {
  make_current(index);
  CUdeviceptr ptr = 0;
  CUresult rc = registry().api.cuMemAlloc(&ptr, bytes);
  *out_of_memory = rc == CUDA_ERROR_OUT_OF_MEMORY;
  if (*out_of_memory) return 0;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemAlloc");
  return ptr;
}

void mem_free(c10::DeviceIndex index, CUdeviceptr ptr) {
  make_current(index);
  SATURN_CU(cuMemFree(ptr));
}

void* host_alloc_pinned(size_t bytes) {
  if (gpu_count() == 0) {
    // Only saturn:0 (host memory) exists: there is nothing to pin for, and a DataLoader with
    // pin_memory=True must work as without saturn. Plain aligned host memory stands in.
    void* ptr = nullptr;
    TORCH_CHECK(posix_memalign(&ptr, 64, bytes > 0 ? bytes : 1) == 0,
                "saturn: out of host memory allocating ", bytes, " bytes");
    return ptr;
  }
  make_current(1);
  void* ptr = nullptr;
  // CU_MEMHOSTALLOC_PORTABLE: pinned for every context, not only saturn:1's.
  SATURN_CU(cuMemHostAlloc(&ptr, bytes, 1));
  return ptr;
}

void host_free_pinned(void* ptr) {
  if (gpu_count() == 0) {  // host_alloc_pinned's stand-in
    std::free(ptr);
    return;
  }
  make_current(1);
  SATURN_CU(cuMemFreeHost(ptr));
}

void copy_h2d(c10::DeviceIndex index, CUdeviceptr dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuMemcpyHtoDAsync(dst, src, bytes, s));
  // The source may be pageable memory the caller frees next: wait for the copy.
  SATURN_CU(cuStreamSynchronize(s));
}

void copy_d2h(c10::DeviceIndex index, void* dst, CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return;
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuMemcpyDtoHAsync(dst, src, bytes, s));
  SATURN_CU(cuStreamSynchronize(s));
}

void copy_d2d(c10::DeviceIndex index, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return;
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuMemcpyDtoDAsync(dst, src, bytes, s));  // stream-ordered: no wait needed
}

void copy_peer(c10::DeviceIndex dst_index, CUdeviceptr dst, c10::DeviceIndex src_index,
               CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return;
  synchronize(src_index);
  synchronize(dst_index);
  SATURN_CU(cuMemcpyPeer(dst, gpu(dst_index).context, src, gpu(src_index).context, bytes));
}

void mem_info(c10::DeviceIndex index, size_t* free_bytes, size_t* total_bytes) {
  make_current(index);
  SATURN_CU(cuMemGetInfo(free_bytes, total_bytes));
}

std::string device_name(c10::DeviceIndex index) {
  if (!is_gpu(index)) {
    check_index(index);
    return "saturn CPU reference device";
  }
  char buf[256] = {0};
  SATURN_CU(cuDeviceGetName(buf, sizeof(buf) - 1, gpu(index).device));
  return buf;
}

int compute_capability(c10::DeviceIndex index) {
  int major = 0, minor = 0;
  Gpu& g = gpu(index);
  SATURN_CU(cuDeviceGetAttribute(&major, kAttrComputeMajor, g.device));
  SATURN_CU(cuDeviceGetAttribute(&minor, kAttrComputeMinor, g.device));
  return major * 10 + minor;
}

namespace {
constexpr CUresult kNotReady = 600;  // CUDA_ERROR_NOT_READY
constexpr unsigned kEventDisableTiming = 2;

void need_events() {
  const Driver& d = registry().api;
  TORCH_CHECK(d.cuEventCreate && d.cuEventRecord && d.cuEventQuery && d.cuEventSynchronize &&
                  d.cuEventElapsedTime && d.cuEventDestroy && d.cuStreamWaitEvent &&
                  d.cuStreamQuery,
              "saturn: the CUDA driver lacks the event entry points");
}
}  // namespace

void* event_create(c10::DeviceIndex index, bool timing) {
  need_events();
  make_current(index);
  void* ev = nullptr;
  SATURN_CU(cuEventCreate(&ev, timing ? 0u : kEventDisableTiming));
  return ev;
}

void event_record(c10::DeviceIndex index, void* event) {
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuEventRecord(event, s));
}

void event_destroy(c10::DeviceIndex index, void* event) noexcept {
  try {
    make_current(index);
    registry().api.cuEventDestroy(event);
  } catch (...) {  // destroying at interpreter exit: the context may be gone
  }
}

bool event_query(c10::DeviceIndex index, void* event) {
  make_current(index);
  CUresult rc = registry().api.cuEventQuery(event);
  if (rc == kNotReady) return false;
  if (rc != CUDA_SUCCESS) fail(rc, "cuEventQuery");
  return true;
}

void event_synchronize(c10::DeviceIndex index, void* event) {
  make_current(index);
  SATURN_CU(cuEventSynchronize(event));
}

void stream_wait_event(c10::DeviceIndex index, void* event) {
  CUstream s = stream(index);
  make_current(index);
  SATURN_CU(cuStreamWaitEvent(s, event, 0));
}

bool stream_query(c10::DeviceIndex index) {
  need_events();
  CUstream s = stream(index);
  make_current(index);
  CUresult rc = registry().api.cuStreamQuery(s);
  if (rc == kNotReady) return false;
  if (rc != CUDA_SUCCESS) fail(rc, "cuStreamQuery");
  return true;
}

float event_elapsed_ms(c10::DeviceIndex index, void* start, void* end) {
  make_current(index);
  float ms = 0;
  SATURN_CU(cuEventElapsedTime(&ms, start, end));
  return ms;
}

}  // namespace saturn
