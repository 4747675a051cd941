// PyTorch glue for block_verify.cu: checks shapes and dtypes, allocates outputs, launches on the
// current stream. Built with block_verify.cu by torch.utils.cpp_extension.load on first use.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <optional>

cudaError_t dflash_block_verify_launch(const void* logits, int logits_dtype, const int64_t* target_tokens,
                                       const int64_t* block_tokens, const int64_t* block_lens,
                                       const float* temperature, const float* top_p, const int64_t* top_k,
                                       const float* accept_uniforms, const float* token_uniforms, int64_t batch,
                                       int64_t width, int64_t vocab, int64_t* accept_lens, int64_t* emitted,
                                       bool* kept_rows, cudaStream_t stream);

namespace {

at::Tensor checked(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dims, const at::Device& device) {
  TORCH_CHECK(t.device() == device, name, " must be on ", device, ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims, name, " must have ", dims, " dimensions, got ", t.dim());
  return t.contiguous();
}

std::vector<at::Tensor> block_verify(const at::Tensor& block_tokens, const std::optional<at::Tensor>& target_logits,
                                     const std::optional<at::Tensor>& target_tokens, const at::Tensor& block_lens,
                                     const at::Tensor& temperature, const at::Tensor& top_p, const at::Tensor& top_k,
                                     const at::Tensor& accept_uniforms, const at::Tensor& token_uniforms) {
  TORCH_CHECK(block_tokens.is_cuda(), "block_verify: tensors must be on a CUDA device");
  const at::Device device = block_tokens.device();
  const c10::cuda::CUDAGuard guard(device);
  const auto blocks = checked(block_tokens, "block_tokens", at::kLong, 2, device);
  const int64_t batch = blocks.size(0), width = blocks.size(1);
  TORCH_CHECK(width >= 1, "block_tokens needs at least one column");
  const auto lens = checked(block_lens, "block_lens", at::kLong, 1, device);
  const auto temp = checked(temperature, "temperature", at::kFloat, 1, device);
  const auto p = checked(top_p, "top_p", at::kFloat, 1, device);
  const auto k = checked(top_k, "top_k", at::kLong, 1, device);
  const auto accept_u = checked(accept_uniforms, "accept_uniforms", at::kFloat, 2, device);
  const auto token_u = checked(token_uniforms, "token_uniforms", at::kFloat, 1, device);
  TORCH_CHECK(lens.size(0) == batch && temp.size(0) == batch && p.size(0) == batch && k.size(0) == batch &&
                  token_u.size(0) == batch && accept_u.size(0) == batch && accept_u.size(1) == width - 1,
              "block_verify: per-request tensors must have ", batch, " rows and accept_uniforms ", width - 1, " columns");

  at::Tensor logits, tokens;
  int dtype_code = 0;
  int64_t vocab = 1;
  if (target_logits.has_value()) {
    logits = target_logits->contiguous();
    TORCH_CHECK(logits.device() == device && logits.dim() == 3 && logits.size(0) == batch && logits.size(1) == width,
                "target_logits must be [", batch, ", ", width, ", vocab] on ", device);
    switch (logits.scalar_type()) {
      case at::kFloat: dtype_code = 0; break;
      case at::kHalf: dtype_code = 1; break;
      case at::kBFloat16: dtype_code = 2; break;
      default: TORCH_CHECK(false, "target_logits must be float32, float16 or bfloat16, got ", logits.scalar_type());
    }
    vocab = logits.size(2);
    TORCH_CHECK(vocab < (int64_t{1} << 32), "vocabulary too large for the 32-bit index in the sort key");
  }
  if (target_tokens.has_value()) tokens = checked(*target_tokens, "target_tokens", at::kLong, 2, device);
  TORCH_CHECK(logits.defined() || tokens.defined(), "block_verify needs target_logits or target_tokens");

  auto accept_lens = at::empty({batch}, blocks.options());
  auto emitted = at::empty({batch, width}, blocks.options());
  auto kept_rows = at::empty({batch, width}, blocks.options().dtype(at::kBool));
  const cudaError_t error = dflash_block_verify_launch(
      logits.defined() ? logits.data_ptr() : nullptr, dtype_code,
      tokens.defined() ? tokens.data_ptr<int64_t>() : nullptr, blocks.data_ptr<int64_t>(), lens.data_ptr<int64_t>(),
      temp.data_ptr<float>(), p.data_ptr<float>(), k.data_ptr<int64_t>(), accept_u.data_ptr<float>(),
      token_u.data_ptr<float>(), batch, width, vocab, accept_lens.data_ptr<int64_t>(), emitted.data_ptr<int64_t>(),
      kept_rows.data_ptr<bool>(), c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(error == cudaSuccess, "block_verify kernel launch failed: ", cudaGetErrorString(error));
  return {accept_lens, emitted, kept_rows};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_verify", &block_verify, "DFlash tree-free block verifier (see block_verify.cu)");
}
