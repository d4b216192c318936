// Analytic FLOP counts of the pi0 / pi0.5 model (for benchmarks and MFU logging), derived from the shapes in
// pi0.cpp, gemma.cpp and siglip.cpp. One multiply-add = 2 FLOPs; only matmuls count (linear layers, the SigLIP
// patch convolution, attention logits and probability·value products); norms, RoPE, activations, softmax and
// embedding lookups are left out (they are O(tokens·width), not O(tokens·width²)).
// NOTE: joint attention computes the full [T,S] logits over [prefix ; suffix] even where the mask blocks them
// (prefix queries never see suffix keys), so the count is the work done, not the minimum work needed.
// Shapes: B batch, C cameras, P patches per image, L prompt tokens, Tp = C·P + L prefix tokens,
// Ts = H (+1 state token for pi0) suffix tokens.
#pragma once
#include <cstdint>

#include "pi0/model/pi0.h"

namespace pi0::model {

/// Forward FLOPs of one pass, by component.
struct ForwardFlops {
  int64_t vision = 0;          ///< SigLIP: patch conv + blocks (projections, attention, MLP)
  int64_t projector = 0;       ///< SigLIP width → prefix width
  int64_t prefix_linear = 0;   ///< prefix expert q/k/v/o + GeGLU MLP, all layers
  int64_t suffix_linear = 0;   ///< action expert q/k/v/o + GeGLU MLP (+ adaRMS modulation for pi0.5), all layers
  int64_t attention = 0;       ///< joint attention logits + PV over the real sequence lengths, all layers
  int64_t action_io = 0;       ///< action_in/out_proj, state_proj / time MLPs
  int64_t total() const { return vision + projector + prefix_linear + suffix_linear + attention + action_io; }
};

/// Forward FLOPs of compute_loss (one joint pass over prefix and suffix, no cache).
ForwardFlops forward_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras);

/// FLOPs of one training step: forward + backward = 3 × forward (backward computes grads of inputs and weights).
int64_t training_step_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras);

/// Forward-only FLOPs of sample_actions: SigLIP once, then with the KV cache one prefix pass + `num_steps`
/// suffix passes (suffix queries against cached prefix keys), without it `num_steps` full joint passes.
int64_t sampling_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t num_steps,
                       bool use_kv_cache);

}  // namespace pi0::model
