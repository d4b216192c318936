// Explicit dimensions of the model's parts, as model.paligemma_variant / model.action_expert_variant /
// model.siglip_variant give them when they are maps instead of variant names. These structs are the one list of
// those keys: the config reads, checks and writes them through visit() (config.h: GemmaSpec, SiglipSpec), and the
// model's options extend them (model::GemmaOptions, model::SiglipOptions), so a key added here reaches the model
// without a copy to write. No torch and no YAML here: the model headers include this file.
#pragma once
#include <cstdint>

namespace pi0::config {

/// A Gemma expert's shape, e.g. gemma_300m = {width 1024, depth 18, mlp_dim 4096, num_heads 8, num_kv_heads 1,
/// head_dim 256}. In a config every field but LoRA's must be given (0 = not given).
struct GemmaDims {
  int64_t width = 0;         ///< model width W, e.g. 2048 for gemma_2b
  int64_t depth = 0;         ///< number of layers, e.g. 18
  int64_t mlp_dim = 0;       ///< GeGLU hidden width, e.g. 16384
  int64_t num_heads = 0;     ///< query heads N, e.g. 8
  int64_t num_kv_heads = 0;  ///< key/value heads K (grouped-query attention; 1 = multi-query)
  int64_t head_dim = 0;      ///< D, e.g. 256
  int64_t lora_rank = 0;     ///< > 0: LoRA on the attention and MLP projections
  double lora_alpha = 0.0;   ///< LoRA scaling = lora_alpha / lora_rank

  template <class V>
  void visit(V& v) {
    v("width", width, "model width");
    v("depth", depth, "number of layers");
    v("mlp_dim", mlp_dim, "GeGLU hidden width");
    v("num_heads", num_heads, "query heads");
    v("num_kv_heads", num_kv_heads, "key/value heads");
    v("head_dim", head_dim, "dimension of one head");
    v("lora_rank", lora_rank, "LoRA rank (0 = no LoRA)");
    v("lora_alpha", lora_alpha, "LoRA alpha");
  }
};

/// A SigLIP tower's shape, e.g. So400m/14 = {width 1152, depth 27, mlp_dim 4304, num_heads 16, patch_size 14}.
struct SiglipDims {
  int64_t width = 0;       ///< e.g. 1152 (a multiple of num_heads)
  int64_t depth = 0;       ///< e.g. 27
  int64_t mlp_dim = 0;     ///< e.g. 4304
  int64_t num_heads = 0;   ///< e.g. 16
  int64_t patch_size = 0;  ///< square patch side in pixels, e.g. 14

  template <class V>
  void visit(V& v) {
    v("width", width, "model width");
    v("depth", depth, "number of layers");
    v("mlp_dim", mlp_dim, "MLP hidden width");
    v("num_heads", num_heads, "attention heads");
    v("patch_size", patch_size, "square patch side in pixels");
  }
};

}  // namespace pi0::config
