// Activation memory (model/activation_memory.h) with per-stack checkpointed layers (CheckpointedLayers): the ends
// are the figures of gradient checkpointing off and on, and each further layer recomputed never raises the estimate,
// at pi0's and pi0.5's full sizes and the dummy model's, in bf16 and float32.
#include <catch2/catch.hpp>

#include "pi0/model/activation_memory.h"

using namespace pi0::model;

TEST_CASE("activation memory by checkpointed layers: all is on, none is off, and monotone between",
          "[unit][model]") {
  for (const bool pi05 : {false, true}) {
    for (const auto& o : {pi0_options(pi05), dummy_options(pi05)}) {
      for (const int64_t e : {2, 4}) {
        CAPTURE(pi05, o.siglip.depth, e);
        constexpr int64_t kBatch = 4, kCameras = 3;
        auto plan = [&](int64_t vision, int64_t language) {
          return activation_memory(o, kBatch, kCameras, e, CheckpointedLayers{vision, language});
        };
        const auto all = all_layers(o);
        const auto on = activation_memory(o, kBatch, kCameras, e, true);
        const auto off = activation_memory(o, kBatch, kCameras, e, false);
        CHECK(plan(all.vision, all.language).saved == on.saved);
        CHECK(plan(all.vision, all.language).transient == on.transient);
        CHECK(plan(all.vision, all.language).last_layer == on.last_layer);
        CHECK(plan(0, 0).saved == off.saved);
        CHECK(on.saved < off.saved);
        // One more layer of either stack never raises the estimate.
        for (int64_t v = 0; v <= all.vision; ++v) {
          for (int64_t l = 0; l <= all.language; ++l) {
            CAPTURE(v, l);
            if (v < all.vision) CHECK(plan(v + 1, l).saved <= plan(v, l).saved);
            if (l < all.language) CHECK(plan(v, l + 1).saved <= plan(v, l).saved);
          }
        }
        // The model keeps the last joint layer, so depth − 1 joint layers is the whole stack's run and figure.
        CHECK(plan(0, all.language - 1).saved == plan(0, all.language).saved);
        // Either stack alone lies strictly between off and on.
        for (const auto& one : {plan(all.vision, 0), plan(0, all.language)}) {
          CHECK(one.saved < off.saved);
          CHECK(one.saved > on.saved);
        }
      }
    }
  }
  const auto o = dummy_options(false);
  CHECK_THROWS(activation_memory(o, 1, 1, 2, CheckpointedLayers{o.siglip.depth + 1, 0}));
  CHECK_THROWS(activation_memory(o, 1, 1, 2, CheckpointedLayers{0, -1}));
}
