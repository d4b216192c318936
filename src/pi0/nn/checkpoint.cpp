#include "pi0/nn/checkpoint.h"

#include <atomic>

#include "pi0/common/profiler.h"

namespace pi0::nn {
namespace {

std::atomic<int64_t> g_recomputations{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The recompute function travels to backward inside the autograd context as a capsule.
struct FnHolder : torch::CustomClassHolder {
  CheckpointFn fn;
  std::vector<bool> input_defined;   // which of the original inputs were defined
  std::vector<bool> output_defined;  // which of fn's outputs were defined
  size_t num_inputs = 0;             // defined inputs; the parameters follow them in the saved list
};

// Re-expands the compacted (defined-only) list to the original positions.
TensorList expand(const variable_list& compact, const std::vector<bool>& defined) {
  TensorList full(defined.size());
  size_t j = 0;
  for (size_t i = 0; i < defined.size(); ++i)
    if (defined[i]) full[i] = compact[j++];
  return full;
}

variable_list compact(const TensorList& full) {
  variable_list out;
  for (const auto& t : full)
    if (t.defined()) out.push_back(t);
  return out;
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList input_refs, c10::IValue holder_value) {
    variable_list inputs = input_refs.vec();
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(holder_value.toCapsule());
    ctx->saved_data["fn"] = holder_value;
    // An output nobody differentiates (the prefix expert's last layer feeds no loss) gets no gradient: without
    // this, autograd would hand backward zeros and the recomputed graph would be differentiated for nothing.
    ctx->set_materialize_grads(false);
    const variable_list layer_inputs(inputs.begin(), inputs.begin() + static_cast<int64_t>(holder->num_inputs));
    ctx->saved_data["num_params"] = static_cast<int64_t>(inputs.size() - holder->num_inputs);
    ctx->save_for_backward(layer_inputs);
    TensorList outputs;
    {
      torch::NoGradGuard no_grad;
      outputs = holder->fn(expand(layer_inputs, holder->input_defined));
    }
    holder->output_defined.clear();
    for (const auto& t : outputs) holder->output_defined.push_back(t.defined());
    return compact(outputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    variable_list input_grads;
    bool any_grad = false;
    for (const auto& g : grad_outputs) any_grad = any_grad || g.defined();
    auto saved = ctx->get_saved_variables();
    const size_t extra = ctx->saved_data["num_params"].toInt() + 1;  // parameters, then the holder argument
    if (!any_grad) {
      input_grads.resize(saved.size() + extra);
      return input_grads;
    }
    variable_list detached;
    for (const auto& t : saved) detached.push_back(t.detach().requires_grad_(t.requires_grad()));
    variable_list outputs;
    {
      ++g_recomputations;
      ProfileScope recompute(phase::kRecompute);  // inside backward's range in the profiler's table
      torch::AutoGradMode enable_grad(true);
      outputs = compact(holder->fn(expand(detached, holder->input_defined)));
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    for (const auto& t : detached) input_grads.push_back(t.requires_grad() ? t.grad() : torch::Tensor());
    // The parameters already received their gradients from the inner backward; nothing more for them or the holder.
    input_grads.resize(input_grads.size() + extra);
    return input_grads;
  }
};

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, const TensorList& params) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto holder = c10::make_intrusive<FnHolder>();
  holder->fn = fn;
  for (const auto& t : inputs) holder->input_defined.push_back(t.defined());
  auto compacted = compact(inputs);
  holder->num_inputs = compacted.size();
  // Trainable parameters ride along as inputs only so the outputs require grad when no input does (the first
  // layer after frozen embeddings); their gradients come from the inner backward.
  for (const auto& p : params)
    if (p.defined() && p.requires_grad()) compacted.push_back(p);
  // NOTE: pass an ArrayRef, not a std::vector: Function::apply only counts TensorList arguments as
  // differentiable inputs (a vector would match its catch-all overload and silently detach the graph).
  auto outputs = CheckpointFunction::apply(at::TensorList(compacted), c10::IValue::make_capsule(holder));
  return expand(outputs, holder->output_defined);
}

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, torch::nn::Module& module) {
  return checkpoint(fn, inputs, module.parameters());
}

int64_t checkpoint_recomputations() { return g_recomputations.load(); }

}  // namespace pi0::nn
