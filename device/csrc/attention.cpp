// Which kernel aten's scaled_dot_product_attention calls on saturn tensors. aten asks the
// device's _fused_sdp_choice stub; without one it writes the math out (two batched
// products and a softmax over the whole [S, S] score matrix, in float32). Where saturn's
// fused kernel can take the call this answers "overrideable", and aten calls
// _scaled_dot_product_fused_attention_overrideable, which saturn implements in Python
// (device/sdpa.py): the fused cuDNN kernel on a GPU, the same math elsewhere; and, with a
// gradient on a GPU, its backward (device/sdpa_grad.py).
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <atomic>

namespace saturn {
namespace {

bool half_type(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// how a gradient is taken (device/sdpa_grad.py's set_kernels; MODES there): 0 aten's math,
// 1 the fused op, 2 (the default) the fused op where training rows were measured faster with
// it: float32 attention over rows whose length is not a multiple of 4, whose math products
// run cuBLAS's unaligned kernels (decision 0132); the math elsewhere
std::atomic<int> grad_mode{2};

// a float32 attention whose query or key length is not a multiple of four floats. A
// symbolic length (dynamo's dynamic shapes) counts as aligned, with no guard on it: a guard
// on its remainder made every fourth length a graph of its own, and the fused op's
// backward does not compile over symbolic lengths yet (it ran uncompiled)
bool unaligned_rows(const at::Tensor& q, const at::Tensor& k) {
  const auto sq = q.sym_size(2).maybe_as_int();
  const auto sk = k.sym_size(2).maybe_as_int();
  if (!sq.has_value() || !sk.has_value()) return false;
  return *sq % 4 != 0 || *sk % 4 != 0;
}

int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                   std::optional<double> /*scale*/, bool enable_gqa) {
  constexpr auto math = static_cast<int64_t>(at::SDPBackend::math);
  if (!at::globalContext().userEnabledOverrideableSDP()) return math;
  // dropout draws from an RNG stream the fused kernel does not share: PyTorch's math
  if (dropout_p > 0.0) return math;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  // float32: saturn's own kernel (codegen/flash_attention.py), on a GPU only; saturn:0 is
  // the CPU reference device and keeps the math
  const bool f32 = q.scalar_type() == at::kFloat && q.device().index() >= 1;
  // a gradient of q, k and v, on a GPU: the fused op's backward (device/sdpa_grad.py:
  // saturn's float32 kernel, cuDNN's for half types); a mask's gradient keeps the math,
  // and so does saturn:0
  const bool mask_grad = mask.has_value() && mask->defined() && mask->requires_grad();
  const bool grad = at::GradMode::is_enabled() &&
                    (q.requires_grad() || k.requires_grad() || v.requires_grad() || mask_grad);
  if (grad) {
    const int mode = grad_mode.load();
    if (mask_grad || q.device().index() < 1 || mode == 0) return math;
    if (mode == 2 && !(f32 && unaligned_rows(q, k))) return math;
  }
  if (!(half_type(q.scalar_type()) || f32) || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type())
    return math;
  const int64_t d = q.sym_size(3).guard_int(__FILE__, __LINE__);
  if (k.sym_size(3).guard_int(__FILE__, __LINE__) != d ||
      v.sym_size(3).guard_int(__FILE__, __LINE__) != d || d % 8 != 0 || d > (f32 ? 128 : 256))
    return math;
  const int64_t hq = q.sym_size(1).guard_int(__FILE__, __LINE__);
  const int64_t hk = k.sym_size(1).guard_int(__FILE__, __LINE__);
  if (v.sym_size(1).guard_int(__FILE__, __LINE__) != hk || hk == 0 || hq % hk != 0) return math;
  // heads that differ without enable_gqa: aten's math raises, as on every device
  if (hq != hk && !enable_gqa) return math;
  if (mask.has_value() && mask->defined()) {
    if (is_causal) return math;  // aten's math raises for this pair; let it
    const auto t = mask->scalar_type();
    if (mask->dim() > 4 || (t != at::kBool && t != q.scalar_type())) return math;
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

}  // namespace
}  // namespace saturn

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &saturn::sdp_choice)
}  // namespace at::native

TORCH_LIBRARY_FRAGMENT(saturn_rt, m) {
  m.def("set_attention_grad_mode(int mode) -> ()",
        [](int64_t mode) { saturn::grad_mode.store(static_cast<int>(mode)); });
}
