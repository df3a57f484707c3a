// The Python module of llmserve's C++ kernels (built by setup.py, or at run time by llmserve/models/kernels.py).
#include <torch/extension.h>

#include <optional>

torch::Tensor q4_linear(torch::Tensor x, torch::Tensor nibbles, torch::Tensor scale, torch::Tensor offset, int64_t N,
                        bool fine, std::optional<torch::Tensor> chans, std::optional<torch::Tensor> wo);
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor offset, int64_t N,
                        bool fine, std::optional<torch::Tensor> chans, std::optional<torch::Tensor> wo, int64_t bits);
std::vector<torch::Tensor> quantize_activations(torch::Tensor x, bool fine, int64_t bits);
bool int8_vnni(bool enable);
bool int8_vnni_active();
torch::Tensor unpack_weights(torch::Tensor codes, torch::Tensor scale, torch::Tensor offset, int64_t N,
                             torch::Tensor out);
torch::Tensor unpack_rows(torch::Tensor codes, torch::Tensor scale, torch::Tensor offset, int64_t N,
                          torch::Tensor index);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor kv_index, torch::Tensor lens, double scale);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps);
torch::Tensor silu_mul(torch::Tensor gu);
torch::Tensor gelu_tanh_mul(torch::Tensor gu);
void qk_norm_(torch::Tensor qkv, torch::Tensor qw, torch::Tensor kw, int64_t H, int64_t KVH, double eps);
torch::Tensor argmax_rows(torch::Tensor x);
void rope_and_cache_(torch::Tensor qkv, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin,
                     torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots, int64_t H, int64_t KVH);
void lora_sgmv_(torch::Tensor y, torch::Tensor x, torch::Tensor a, torch::Tensor b, torch::Tensor parts,
                torch::Tensor segs);

// setup.py names the sources it built from (llmserve/models/kernels.py checks it)
#define LLMSERVE_STR2(x) #x
#define LLMSERVE_STR(x) LLMSERVE_STR2(x)
#ifdef LLMSERVE_SOURCES_DIGEST
#define LLMSERVE_DIGEST LLMSERVE_STR(LLMSERVE_SOURCES_DIGEST)
#else
#define LLMSERVE_DIGEST ""
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("sources_digest") = LLMSERVE_DIGEST;
  // chans / wo: outlier channels taken exactly (qdot_linear.cpp); omitted, none
  m.def("q4_linear", &q4_linear, "4-bit weight codes x activations quantised per 32, integer dot products (AVX2)",
        py::arg("x"), py::arg("codes"), py::arg("scale"), py::arg("offset"), py::arg("N"), py::arg("fine"),
        py::arg("chans") = py::none(), py::arg("wo") = py::none());
  // bits: one-byte activations rounded to 8 or 7 bits (7: the sign fix-ups of the AVX2 dot go)
  m.def("q8_linear", &q8_linear, "8-bit weight codes x activations quantised per 32, integer dot products (AVX2)",
        py::arg("x"), py::arg("codes"), py::arg("scale"), py::arg("offset"), py::arg("N"), py::arg("fine"),
        py::arg("chans") = py::none(), py::arg("wo") = py::none(), py::arg("bits") = 8);
  m.def("quantize_activations", &quantize_activations, "the activations as q4_linear / q8_linear quantise them",
        py::arg("x"), py::arg("fine"), py::arg("bits") = 8);
  m.def("int8_vnni", &int8_vnni, "use the AVX-512 VNNI path of q4_linear / q8_linear where the CPU has it");
  m.def("int8_vnni_active", &int8_vnni_active, "whether q4_linear / q8_linear take the AVX-512 VNNI path now");
  m.def("unpack_weights", &unpack_weights, "the fp32 weights packed codes hold, into a reused buffer (AVX2)");
  m.def("unpack_rows", &unpack_rows, "the fp32 weights of some outputs (rows of W) packed codes hold (AVX2)");
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over the paged KV pool (AVX2)");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row");
  m.def("add_rms_norm_", &add_rms_norm_, "x += r in place, then RMSNorm of each row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of [gate | up] rows");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu(gate) * up of [gate | up] rows, GELU's tanh form");
  m.def("qk_norm_", &qk_norm_, "RMSNorm over each q and k head of qkv, in place");
  m.def("argmax_rows", &argmax_rows, "index of each row's first maximum");
  m.def("rope_and_cache_", &rope_and_cache_, "RoPE on the q and k heads of qkv in place, k and v to the KV pool");
  m.def("lora_sgmv_", &lora_sgmv_, "y += each segment's rows times its slot's LoRA factors, in place (AVX2)");
}
