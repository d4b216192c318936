#include "pi0/train/metrics_processor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

namespace pi0::train {

using Clock = std::chrono::steady_clock;

MetricsProcessor::MetricsProcessor(const config::TrainConfig& train, int64_t rank, int64_t world_size,
                                   std::shared_ptr<distributed::ProcessGroup> pg,
                                   const distributed::GradReducerStats* comm)
    : log_interval_(train.log_interval),
      record_interval_(train.metrics_interval > 0 ? train.metrics_interval : train.log_interval),
      num_steps_(train.num_steps),
      global_batch_(train.batch_size),
      rank_(rank),
      world_size_(world_size),
      pg_(std::move(pg)),
      comm_(comm),
      tensorboard_(train.tensorboard) {}

std::string MetricsProcessor::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(s / 3600), static_cast<long>((s % 3600) / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(s / 60), static_cast<long>(s % 60));
  }
  return buf;
}

MetricsProcessor::Interval MetricsProcessor::fresh_interval() const {
  Interval iv;
  if (comm_) iv.comm_start = *comm_;
  return iv;
}

void MetricsProcessor::start(int64_t step, const std::string& metrics_path) {
  log_ = fresh_interval();
  record_ = fresh_interval();
  if (rank_ != 0) return;
  writer_.emplace(metrics_path, step + 1);
  if (tensorboard_) {
    const auto run_dir = std::filesystem::path(metrics_path).parent_path().string();
    writer_->mirror_to(std::make_unique<TensorBoardWriter>(run_dir.empty() ? "." : run_dir, step));
    spdlog::info("TensorBoard: {} (view: tensorboard --logdir {})", writer_->tensorboard()->path(),
                 run_dir.empty() ? "." : run_dir);
  }
}

void MetricsProcessor::log_camera_views(int64_t step, const std::vector<torch::Tensor>& images) {
  if (rank_ != 0 || !writer_ || !writer_->tensorboard() || images.empty()) return;
  writer_->tensorboard()->add_images(step, camera_views(images));
}

std::map<std::string, double> MetricsProcessor::close(Interval& iv, double lr, double grad_norm) {
  double mean_loss = iv.loss / static_cast<double>(iv.steps);
  if (pg_) {  // the logged loss is the mean over ranks
    auto l = torch::tensor({mean_loss}, torch::kFloat64);
    pg_->all_reduce_sum(l, "loss logging");
    mean_loss = l.item<double>() / static_cast<double>(world_size_);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - iv.start).count();
  const double step_time = elapsed / static_cast<double>(iv.steps);
  const double step_cpu = (thread_cpu_seconds() - iv.cpu_start) / static_cast<double>(iv.steps);
  std::map<std::string, double> record = {{"loss", mean_loss},
                                          {"grad_norm", grad_norm},
                                          {"lr", lr},
                                          {"samples_per_s", static_cast<double>(global_batch_) / step_time},
                                          {"step_time_s", step_time},
                                          {"step_cpu_s", step_cpu}};
  if (iv.offload_steps > 0) {
    const double n = static_cast<double>(iv.offload_steps);
    record["offload_grad_s"] = iv.offload_grad / n;
    record["offload_update_s"] = iv.offload_update / n;
    record["offload_wait_s"] = iv.offload_wait / n;
  }
  if (iv.ki_steps > 0) {
    // Every rank runs KI or none does (one config), so this collective is taken by all or by none.
    auto sums = torch::tensor({iv.ki_ce, iv.ki_flow, iv.ki_correct, iv.ki_targets}, torch::kFloat64);
    double ranks = 1;
    if (pg_) {
      pg_->all_reduce_sum(sums, "knowledge-insulation metrics");
      ranks = static_cast<double>(world_size_);
    }
    const double n = static_cast<double>(iv.ki_steps) * ranks;
    record["ce_fast"] = sums[0].item<double>() / n;
    record["flow_loss"] = sums[1].item<double>() / n;
    record["fast_acc"] = sums[2].item<double>() / std::max(sums[3].item<double>(), 1.0);
  }
  if (iv.fast_steps > 0) {
    // One model type per run: every rank takes this collective, or none does.
    auto sums = torch::tensor({iv.fast_correct, iv.fast_targets}, torch::kFloat64);
    if (pg_) pg_->all_reduce_sum(sums, "pi0-FAST accuracy");
    record["fast_acc"] = sums[0].item<double>() / std::max(sums[1].item<double>(), 1.0);
  }
  if (iv.fast_decoding_steps > 0) {
    // pi0_fast or train.ki, one config: every rank takes this collective, or none does.
    auto sums = torch::tensor({iv.fast_undecodable, iv.fast_sequences}, torch::kFloat64);
    if (pg_) pg_->all_reduce_sum(sums, "FAST decoding metrics");
    record["fast_undecodable"] = sums[0].item<double>() / std::max(sums[1].item<double>(), 1.0);
  }
  if (iv.sub_steps > 0) {
    // As the KI metrics: one config, so every rank takes this collective or none does.
    auto sums = torch::tensor({iv.sub_ce, iv.sub_correct, iv.sub_targets}, torch::kFloat64);
    double ranks = 1;
    if (pg_) {
      pg_->all_reduce_sum(sums, "subtask metrics");
      ranks = static_cast<double>(world_size_);
    }
    record["ce_subtask"] = sums[0].item<double>() / (static_cast<double>(iv.sub_steps) * ranks);
    record["subtask_acc"] = sums[1].item<double>() / std::max(sums[2].item<double>(), 1.0);
  }
  if (comm_) {
    // Per step: the gradient all-reduce span (first bucket launched → last done) and the part of it backward
    // did not hide (time in wait()).
    const auto& c = *comm_;
    const double n = static_cast<double>(std::max<int64_t>(c.steps - iv.comm_start.steps, 1));
    record["comm_s"] = (c.comm_seconds - iv.comm_start.comm_seconds) / n;
    record["comm_exposed_s"] = (c.wait_seconds - iv.comm_start.wait_seconds) / n;
  }
  iv = fresh_interval();
  return record;
}

void MetricsProcessor::add_offload_times(double host_grad_s, double host_update_s, double forward_wait_s) {
  for (Interval* iv : {&log_, &record_}) {
    iv->offload_grad += host_grad_s, iv->offload_update += host_update_s, iv->offload_wait += forward_wait_s;
    ++iv->offload_steps;
  }
}

void MetricsProcessor::add_ki(double ce, double flow, double correct, double targets) {
  for (Interval* iv : {&log_, &record_}) {
    iv->ki_ce += ce, iv->ki_flow += flow, iv->ki_correct += correct, iv->ki_targets += targets;
    ++iv->ki_steps;
  }
}

void MetricsProcessor::add_fast_accuracy(double correct, double targets) {
  for (Interval* iv : {&log_, &record_}) iv->fast_correct += correct, iv->fast_targets += targets, ++iv->fast_steps;
}

void MetricsProcessor::add_fast_decoding(double undecodable, double sequences) {
  for (Interval* iv : {&log_, &record_}) {
    iv->fast_undecodable += undecodable, iv->fast_sequences += sequences;
    ++iv->fast_decoding_steps;
  }
}

void MetricsProcessor::add_subtask(double ce, double correct, double targets) {
  for (Interval* iv : {&log_, &record_}) {
    iv->sub_ce += ce, iv->sub_correct += correct, iv->sub_targets += targets;
    ++iv->sub_steps;
  }
}

void MetricsProcessor::log(int64_t step, double loss, double grad_norm, double lr) {
  for (Interval* iv : {&log_, &record_}) iv->loss += loss, ++iv->steps;
  const bool last = step == num_steps_;
  std::optional<std::map<std::string, double>> record;
  if (step % record_interval_ == 0 || last) {
    record = close(record_, lr, grad_norm);
    if (rank_ == 0) writer_->write(step, *record);
  }
  if (step % log_interval_ != 0 && !last) return;
  // With equal intervals the progress line shows the record just written (one collective, not two).
  const auto line = record_interval_ == log_interval_ ? *record : close(log_, lr, grad_norm);
  if (record_interval_ == log_interval_) log_ = fresh_interval();
  if (rank_ != 0) return;
  // Slow runs (a full-size model on a CPU) read better in seconds per step than in "0.0 samples/s".
  const double samples_per_s = line.at("samples_per_s"), step_time = line.at("step_time_s");
  char speed[48];
  if (samples_per_s < 0.1) std::snprintf(speed, sizeof speed, "%.1f s/step", step_time);
  else std::snprintf(speed, sizeof speed, "%.1f samples/s", samples_per_s);
  char val[40] = "";
  if (last_val_loss_) std::snprintf(val, sizeof val, " | val_loss %.4f", *last_val_loss_);
  char host[96] = "";
  if (line.count("offload_grad_s"))
    std::snprintf(host, sizeof host, " | host: grads %.2f s, update %.2f s, forward waited %.2f s",
                  line.at("offload_grad_s"), line.at("offload_update_s"), line.at("offload_wait_s"));
  char ki[112] = "";
  char undecodable[40] = "";
  if (line.count("fast_undecodable"))
    std::snprintf(undecodable, sizeof undecodable, ", undecodable %.3f", line.at("fast_undecodable"));
  if (line.count("ce_fast"))
    std::snprintf(ki, sizeof ki, " (ce_fast %.4f, flow %.4f, fast_acc %.3f%s)", line.at("ce_fast"),
                  line.at("flow_loss"), line.at("fast_acc"), undecodable);
  else if (line.count("fast_acc"))
    std::snprintf(ki, sizeof ki, " (fast_acc %.3f%s)", line.at("fast_acc"), undecodable);
  char sub[64] = "";
  if (line.count("ce_subtask"))
    std::snprintf(sub, sizeof sub, " (ce_subtask %.4f, subtask_acc %.3f)", line.at("ce_subtask"),
                  line.at("subtask_acc"));
  spdlog::info("step {}/{} | loss {:.4f}{}{}{} | grad_norm {:.3f} | lr {:.2e} | {}{} | ETA {}", step, num_steps_,
               line.at("loss"), ki, sub, val, grad_norm, lr, speed, host,
               format_duration(step_time * static_cast<double>(num_steps_ - step)));
}

void MetricsProcessor::log_validation(int64_t step, const ValidationResult& v, double seconds) {
  last_val_loss_ = v.loss;
  if (rank_ != 0) return;
  const auto& datasets = v.datasets;
  std::map<std::string, double> record = {{"val_loss", v.loss}, {"val_action_mse", v.action_mse}};
  std::string extra;
  if (v.subtask_ce && v.subtask_acc) {
    record["val_ce_subtask"] = *v.subtask_ce;
    record["val_subtask_acc"] = *v.subtask_acc;
    extra = fmt::format(" | val_ce_subtask {:.4f} (val_subtask_acc {:.3f})", *v.subtask_ce, *v.subtask_acc);
  }
  if (v.fast_undecodable) {
    record["val_fast_undecodable"] = *v.fast_undecodable;
    extra += fmt::format(" | val_fast_undecodable {:.3f}", *v.fast_undecodable);
  }
  // A single dataset's values are the aggregate: only a mixture gets per-dataset keys.
  const bool per_dataset = datasets.size() > 1;
  for (const auto& d : datasets) {
    if (!per_dataset || d.samples == 0) continue;
    record[dataset_key("val_loss", d.name)] = d.loss;
    record[dataset_key("val_action_mse", d.name)] = d.action_mse;
  }
  writer_->write(step, record);
  spdlog::info("step {}/{} | val_loss {:.4f} | val_action_mse {:.4f}{} | {} held-out samples in {:.1f} s", step,
               num_steps_, v.loss, v.action_mse, extra, v.samples, seconds);
  for (const auto& d : datasets) {
    if (!per_dataset) break;
    if (d.samples == 0) {
      spdlog::info("step {}/{} |   dataset '{}': no held-out samples in this pass", step, num_steps_, d.name);
      continue;
    }
    spdlog::info("step {}/{} |   dataset '{}': val_loss {:.4f} | val_action_mse {:.4f} | {} samples", step,
                 num_steps_, d.name, d.loss, d.action_mse, d.samples);
  }
}

}  // namespace pi0::train
