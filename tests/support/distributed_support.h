// Helpers for tests that run data-parallel ranks: a free TCP port on loopback for the rendezvous, and a tiny
// "model" whose gradient flow exercises every reducer path (a parameter accumulated twice per backward under
// re-entrant checkpointing, an unused one, a float64 one).
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <array>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/process_group.h"
#include "pi0/nn/checkpoint.h"

namespace pi0::testing {

/// A TCP port that was free a moment ago on 127.0.0.1 (for MASTER_PORT).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

/// Runs `body(pg, rank)` for ranks 0 and 1 of a Gloo group on 127.0.0.1, each on its own thread; returns what
/// each rank threw (empty when it returned).
inline std::array<std::string, 2> run_two_ranks(
    const std::function<void(pi0::distributed::ProcessGroup&, int)>& body) {
  const int port = free_port();
  std::array<std::string, 2> errors;
  auto rank_main = [&](int rank) {
    try {
      pi0::distributed::DistEnv env;
      env.rank = rank;
      env.world_size = 2;
      env.master_port = port;
      pi0::distributed::ProcessGroup pg(env, torch::kCPU, std::chrono::seconds(30));
      body(pg, rank);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  return errors;
}

/// w1 (used twice, in two re-entrant checkpoint segments: its AccumulateGrad fires twice per backward), w2, an
/// optional parameter no one uses, and a float64 parameter. The initial values are fixed tensors, not drawn: rank
/// threads must not share the global generator.
struct Replica {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  explicit Replica(bool with_unused) {
    params = {{"w1", torch::linspace(-1, 1, 256).view({16, 16})}, {"w2", torch::linspace(1, -0.5, 64).view({16, 4})}};
    if (with_unused) params.emplace_back("unused", torch::ones({3}));
    params.emplace_back("d", torch::linspace(0.5, 1, 4, torch::kFloat64));
    for (auto& [n, p] : params) p.requires_grad_(true);
  }
  torch::Tensor& get(const std::string& n) {
    for (auto& [name, p] : params)
      if (name == n) return p;
    throw std::runtime_error(n);
  }
  torch::Tensor loss(const torch::Tensor& x) {
    auto& w1 = get("w1");
    auto layer = [&](const pi0::nn::TensorList& in) { return pi0::nn::TensorList{torch::tanh(in[0].mm(w1))}; };
    auto h = pi0::nn::checkpoint(layer, pi0::nn::checkpoint(layer, {x}))[0];
    return (h.mm(get("w2")).pow(2).sum(1).to(torch::kFloat64) * get("d").sum()).mean();
  }
};

}  // namespace pi0::testing
