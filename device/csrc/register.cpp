// Registrations with the dispatcher: native kernels, the counted CPU fallback,
// and the runtime queries Python reads (namespace saturn_rt).
#include "allocator.h"
#include "driver.h"
#include "guard.h"
#include "hooks.h"
#include "ops.h"
#include "storage.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace saturn {
namespace {

std::mutex fallback_mu;
std::map<std::string, int64_t>& fallback_counts() {
  static std::map<std::string, int64_t> counts;
  return counts;
}

// Every op without a saturn kernel runs here: arguments copied to the CPU, the
// CPU kernel run, results (and mutated arguments) copied back. Counted by name.
void counted_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  const std::string key = name.overload_name.empty() ? name.name
                                                     : name.name + "." + name.overload_name;
  {
    std::lock_guard<std::mutex> lock(fallback_mu);
    ++fallback_counts()[key];
  }
  // A saturn generator passed explicitly (torch.randn(..., generator=g)): the CPU kernel
  // takes only a CPU one, so it draws from a CPU generator holding g's state, which g
  // takes back afterwards (the same numbers as a CPU generator seeded alike).
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::vector<std::pair<at::Generator, at::Generator>> swapped;  // (saturn's, stand-in)
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (!v.isGenerator()) continue;
    at::Generator g = v.toGenerator();
    if (!g.defined() || g.device().type() != c10::DeviceType::PrivateUse1) continue;
    at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>();
    {
      std::lock_guard<std::mutex> lock(g.mutex());
      cpu.set_state(g.get_state());
    }
    v = c10::IValue(cpu);
    swapped.emplace_back(g, cpu);
  }
  at::native::cpu_fallback(op, stack);
  for (auto& [g, cpu] : swapped) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(cpu.get_state());
  }
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> fallback_snapshot() {
  std::lock_guard<std::mutex> lock(fallback_mu);
  std::vector<std::string> names;
  std::vector<int64_t> counts;
  for (const auto& [k, v] : fallback_counts()) {
    names.push_back(k);
    counts.push_back(v);
  }
  return {names, counts};
}

// A kernel written in Python that declined its arguments and ran PyTorch's CPU kernel.
void count_fallback(const std::string& key) {
  std::lock_guard<std::mutex> lock(fallback_mu);
  ++fallback_counts()[key];
}

void fallback_reset() {
  std::lock_guard<std::mutex> lock(fallback_mu);
  fallback_counts().clear();
}

c10::DeviceIndex narrow(int64_t index) { return static_cast<c10::DeviceIndex>(index); }

std::vector<int64_t> memory_counters(int64_t index) {
  const Counters c = counters(resolve(narrow(index)));
  return {c.allocated, c.reserved, c.peak_allocated, c.peak_reserved, c.hits,
          c.misses,    c.retries,  c.failures,       c.allocations};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  // views with per-device kernels (the rest are composite): PyTorch's own, which only
  // restride the storage; the CPU fallback would return a copy, and writes through it
  // would be lost
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
}

// Autocast (torch.autocast("saturn")): CUDA's policy, from the op lists ATen shares with
// every backend: products and convolutions in the lower precision, ops that lose accuracy
// there (softmax, norms, losses, exp/log, ...) in float32, mixed-type ops promoted to the
// widest type. Everything else passes through the autocast key untouched.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // the shared lists spell signatures inside namespace at, and which names they use
  // varies by release: 2.11's names DimnameList; 2.14 has no named tensors at all
#if __has_include(<ATen/core/Dimname.h>)
  using at::DimnameList;
#endif
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
#define SATURN_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define SATURN_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define SATURN_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define SATURN_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(SATURN_LOWER)
  AT_FORALL_FP32(SATURN_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(SATURN_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(SATURN_PROMOTE)
#undef SATURN_LOWER
#undef SATURN_FP32
#undef SATURN_FP32_OPT
#undef SATURN_PROMOTE
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&counted_cpu_fallback>());
}

TORCH_LIBRARY(saturn_rt, m) {
  m.def("device_count() -> int", [] { return static_cast<int64_t>(device_count()); });
  m.def("gpu_unavailable_reason() -> str", [] { return gpu_unavailable_reason(); });
  m.def("current_device() -> int", [] { return static_cast<int64_t>(current_device()); });
  m.def("set_device(int index) -> ()", [](int64_t i) { set_current_device(narrow(i)); });
  m.def("synchronize(int index) -> ()", [](int64_t i) { synchronize(resolve(narrow(i))); });
  m.def("stream(int index) -> int", [](int64_t i) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(stream(narrow(i))));
  });
  m.def("device_name(int index) -> str", [](int64_t i) { return device_name(resolve(narrow(i))); });
  m.def("compute_capability(int index) -> int",
        [](int64_t i) { return static_cast<int64_t>(compute_capability(narrow(i))); });
  m.def("memory_counters(int index) -> int[]", &memory_counters);
  m.def("mem_get_info(int index) -> int[]", [](int64_t i) {
    const auto [free_b, total_b] = device_allocator()->getMemoryInfo(resolve(narrow(i)));
    return std::vector<int64_t>{static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
  });
  m.def("empty_cache(int index) -> int",
        [](int64_t i) { return static_cast<int64_t>(empty_cache(resolve(narrow(i)))); });
  m.def("reset_peak(int index) -> ()", [](int64_t i) { reset_peak(resolve(narrow(i))); });
  m.def("reset_accumulated(int index) -> ()",
        [](int64_t i) { reset_accumulated(resolve(narrow(i))); });
  m.def("size_class(int nbytes) -> int",
        [](int64_t n) { return static_cast<int64_t>(size_class(static_cast<size_t>(n))); });
  m.def("manual_seed(int index, int seed) -> ()", [](int64_t i, int64_t seed) {
    at::Generator g = default_generator(narrow(i));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(static_cast<uint64_t>(seed));
  });
  m.def("initial_seed(int index) -> int", [](int64_t i) {
    return static_cast<int64_t>(default_generator(narrow(i)).current_seed());
  });
  m.def("get_rng_state(int index) -> Tensor", [](int64_t i) {
    at::Generator g = default_generator(narrow(i));
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  });
  m.def("set_rng_state(int index, Tensor state) -> ()", [](int64_t i, const at::Tensor& state) {
    at::Generator g = default_generator(narrow(i));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  });
  m.def("fallback_counts() -> (str[], int[])", &fallback_snapshot);
  // implemented in Python (device/eager_pointwise.py); copy_from calls it
  m.def("device_copy(Tensor src, Tensor(a!) dst) -> bool");
  m.def("swap_storage_data(Tensor a, Tensor b) -> ()",
        [](const at::Tensor& a, const at::Tensor& b) {
          swap_storage_data(a.storage().unsafeGetStorageImpl(),
                            b.storage().unsafeGetStorageImpl());
        });
  m.def("fallback_reset() -> ()", &fallback_reset);
  m.def("count_fallback(str key) -> ()", [](const std::string& key) { count_fallback(key); });
}

}  // namespace saturn
