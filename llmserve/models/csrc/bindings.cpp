// The Python module of llmserve's C++ kernels (built by llmserve/models/kernels.py).
#include <torch/extension.h>

torch::Tensor w8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor offset);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor kv_index, torch::Tensor lens, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("w8_linear", &w8_linear, "weight-only int8 matrix-vector products, 32-weight affine groups (AVX2)");
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over the paged KV pool (AVX2)");
}
