#include "ops.h"

#include "allocator.h"
#include "driver.h"
#include "guard.h"
#include "storage.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

namespace saturn {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

bool is_saturn(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }
bool on_gpu(const at::Tensor& t) { return is_saturn(t) && is_gpu(t.device().index()); }
// -1 is host memory for copy_bytes.
c10::DeviceIndex memory_index(const at::Tensor& t) { return is_saturn(t) ? t.device().index() : -1; }

c10::Device device_of(std::optional<c10::Device> device) {
  const c10::DeviceIndex index = resolve(device ? device->index() : -1);
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

// Elements from the first to the last one a tensor can address (its span).
int64_t span_elements(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  return span;
}

// A CPU tensor aliasing a tensor whose memory is host memory (CPU or saturn:0).
at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

// A CPU copy of a GPU tensor's span, viewed with the same strides.
at::Tensor stage_down(const at::Tensor& t, bool fill) {
  at::Tensor buffer = at::detail::empty_cpu({span_elements(t)}, t.scalar_type(), false,
                                            std::nullopt);
  if (fill) {
    copy_bytes(buffer.data_ptr(), -1, t.data_ptr(), t.device().index(),
               buffer.numel() * t.element_size());
  }
  return buffer.as_strided(t.sizes(), t.strides(), 0);
}

void stage_up(const at::Tensor& staged, const at::Tensor& t) {
  copy_bytes(t.data_ptr(), t.device().index(), staged.data_ptr(), -1,
             span_elements(t) * t.element_size());
}

// A same-GPU copy that converts dtype, or gathers a strided source into a packed
// destination, runs saturn's kernels: the op saturn_rt::device_copy, implemented in Python
// (device/eager_pointwise.py). It returns false for what it does not take.
bool device_copy(const at::Tensor& src, const at::Tensor& dst) {
  static const auto handle =
      c10::Dispatcher::singleton().findOp(c10::OperatorName("saturn_rt::device_copy", ""));
  if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return false;
  static const auto op = handle->typed<bool(const at::Tensor&, const at::Tensor&)>();
  return op.call(src, dst);
}

}  // namespace

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "saturn device tensors cannot be pinned; pin CPU "
              "tensors instead");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "saturn supports only strided tensors");
  c10::DeviceGuard guard(device_of(device));
  return at::detail::empty_generic(size, device_allocator(), kKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "saturn device tensors cannot be pinned");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "saturn supports only strided tensors");
  c10::DeviceGuard guard(device_of(device));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kKeys,
                                           c10::dtype_or_default(dtype));
}

// One transfer when both sides are dense with the same layout and dtype; a kernel on one
// GPU where device_copy takes it; otherwise staged through host memory, where the CPU copy
// converts dtype and layout.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  at::Tensor src = self;
  if (src.sizes() != dst.sizes()) src = src.expand(dst.sizes());  // raises on a mismatch
  if (dst.numel() == 0) return dst;
  if (!on_gpu(src) && !on_gpu(dst)) {
    host_alias(dst).copy_(host_alias(src));
    return dst;
  }
  if (src.scalar_type() == dst.scalar_type() && src.strides() == dst.strides() &&
      src.is_non_overlapping_and_dense() && dst.is_non_overlapping_and_dense()) {
    copy_bytes(dst.data_ptr(), memory_index(dst), src.data_ptr(), memory_index(src),
               dst.numel() * dst.element_size());
    return dst;
  }
  if (on_gpu(src) && src.device() == dst.device() && device_copy(src, dst)) return dst;
  const at::Tensor src_host = on_gpu(src) ? stage_down(src, true) : host_alias(src);
  if (!on_gpu(dst)) {
    host_alias(dst).copy_(src_host);
    return dst;
  }
  // A dense destination is overwritten whole; a strided one keeps the bytes between.
  at::Tensor dst_host = stage_down(dst, !dst.is_non_overlapping_and_dense());
  dst_host.copy_(src_host);
  stage_up(dst_host, dst);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

namespace {
void ensure_storage(const at::Tensor& self) {
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.element_size(), self.storage_offset());
  c10::StorageImpl* storage = self.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resize_storage_bytes(storage, needed);
}
}  // namespace

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (auto s : size) TORCH_CHECK(s >= 0, "resize_: negative size ", s, " in ", size);
  c10::DeviceGuard guard(self.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  ensure_storage(self);
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: expected a saturn storage, got one on ", source.device());
  TORCH_CHECK(storage_offset >= 0, "set_: negative storage offset ", storage_offset);
  TORCH_CHECK(stride.empty() || stride.size() == size.size(),
              "set_: ", size.size(), " sizes but ", stride.size(), " strides");
  c10::DeviceGuard guard(source.device());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  ensure_storage(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / self.element_size();
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return set_storage_offset(self, std::move(empty), 0, {0}, {});
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::detail::empty_cpu({}, self.scalar_type(), false, std::nullopt);
  copy_bytes(host.data_ptr(), -1, self.data_ptr(), memory_index(self), self.element_size());
  return host.item();
}

// Whether `from`'s TensorImpl may be shallow-copied into `self` (`self.data = from`, and
// Module._apply's choice between keeping a Parameter and making a new one). PyTorch's
// answer counts only its own dense backends, so `model.to("saturn:N")` made new
// Parameters and untied shared weights; a saturn tensor is a plain dense TensorImpl like
// theirs. Dispatched here only when one of the two is a saturn tensor.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](c10::DispatchKeySet ks) {
    constexpr auto backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
         c10::BackendComponent::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
  };
  const auto a = self.key_set(), b = from.key_set();
  return a == b || (dense(a) && dense(b) && !self.is_sparse() && !from.is_sparse() &&
                    self.layout() == c10::kStrided && from.layout() == c10::kStrided);
}

}  // namespace saturn
