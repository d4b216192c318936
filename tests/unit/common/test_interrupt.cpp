// Interruption points: a stop requested during start-up ends a model build and a weight load at the next layer
// or tensor (pi0::Interrupted), and nothing changes while no stop is requested.
#include <catch2/catch.hpp>

#include <csignal>

#include "pi0/common/interrupt.h"
#include "pi0/config/config.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"
#include "pi0/train/signals.h"
#include "support/test_support.h"

using namespace pi0;

namespace {
// Clears the interrupt however the test ends: a leftover flag would stop every later model build in this process.
struct ClearInterrupt {
  ~ClearInterrupt() { clear_interrupt(); }
};
}  // namespace

TEST_CASE("a stop request ends a model build and a weight load at the next interruption point", "[unit][train]") {
  ClearInterrupt guard;
  const auto cfg = config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml");
  const auto opts = model::options_from_config(cfg.model);
  testing::TempDir dir("pi0interrupt");
  model::Pi0 model(opts);
  io::save_model_weights(*model, dir.str("model.safetensors"));
  CHECK_NOTHROW(interruption_point());

  request_interrupt();
  CHECK(interrupt_requested());
  CHECK_THROWS_AS(model::Pi0(opts), Interrupted);
  CHECK_THROWS_AS(io::load_model_weights(*model, dir.str("model.safetensors")), Interrupted);

  clear_interrupt();
  CHECK_NOTHROW(model::Pi0(opts));
  CHECK_NOTHROW(io::load_model_weights(*model, dir.str("model.safetensors")));
}

TEST_CASE("the stop signal handler also requests the start-up interrupt", "[unit][train]") {
  ClearInterrupt guard;
  train::install_stop_signal_handlers();
  REQUIRE(raise(SIGINT) == 0);
  CHECK(train::stop_requested());
  CHECK(interrupt_requested());
  CHECK_THROWS_AS(interruption_point(), Interrupted);
  train::reset_stop_request();
  CHECK_FALSE(interrupt_requested());
  train::uninstall_stop_signal_handlers();
}
