#include "client/decode_bench.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "client/percentile.h"
#include "client/workload.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

const char* OutputsName(wire::OutputLayers o) {
  return o == wire::OutputLayers::ALL ? "all" : o == wire::OutputLayers::LAST ? "last" : "none";
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

}  // namespace

absl::StatusOr<DecodeBenchReport> RunDecodeBench(
    Client& client, const DecodeBenchConfig& config,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress) {
  if (config.batch <= 0 || config.context <= 0 || config.steps <= 0) {
    return absl::InvalidArgumentError("batch, context and steps must be positive");
  }
  ASSIGN_OR_RETURN(PoolHealth health, client.Health());
  if (config.pool_kind.has_value() && *config.pool_kind != health.spec.kind) {
    return absl::FailedPreconditionError(
        absl::StrCat("asked to bench a ", PoolKindName(*config.pool_kind), " pool; kvpoold serves ",
                     health.spec.DebugString()));
  }
  DecodeBenchReport report;
  report.config = config;
  report.spec = health.spec;
  report.model = health.model;
  WorkloadConfig prompt_config;
  prompt_config.prompt_tokens = config.context;
  prompt_config.seed = 0xBE7C4;
  const std::vector<int32_t> prompt = WorkloadPrompt(prompt_config, 0);
  const uint64_t base = uint64_t{1} << 40;
  const auto t0 = Clock::now();
  RETURN_IF_ERROR(client.Prefill(base, prompt).status());
  report.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int i = 1; i < config.batch; ++i) RETURN_IF_ERROR(client.Fork(base, base + i).status());

  std::vector<double> e2e, worker;
  double handle_ms = 0, broker_ms = 0;
  const int total = config.warmup + config.steps;
  for (int step = 0; step < total; ++step) {
    std::vector<DecodeStepRequest> steps(config.batch);
    for (int i = 0; i < config.batch; ++i) {
      const int64_t needle = WorkloadNeedlePosition(prompt_config, i, step, config.context);
      steps[i] = DecodeStepRequest{base + i, WorkloadDecodeToken(prompt_config, i, step),
                                   NeedleSpec{needle, prompt[needle], 0.35f}, nullptr, nullptr};
    }
    const auto s0 = Clock::now();
    ASSIGN_OR_RETURN(DecodeResult result, client.Decode(steps, config.outputs));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - s0).count();
    if (step >= config.warmup) {
      e2e.push_back(ms);
      worker.push_back(result.worker_micros * 1e-3);
      handle_ms += result.worker_handle_micros * 1e-3;
      broker_ms += result.broker_micros * 1e-3;
    }
    progress("decode", step + 1, total);
  }
  for (int i = 0; i < config.batch; ++i) RETURN_IF_ERROR(client.Release(base + i).status());
  report.e2e_p50_ms = Percentile(e2e, 0.5);
  report.e2e_p99_ms = Percentile(e2e, 0.99);
  report.e2e_mean_ms = Mean(e2e);
  report.worker_p50_ms = Percentile(worker, 0.5);
  report.worker_mean_ms = Mean(worker);
  report.worker_handling_ms = handle_ms / config.steps - report.worker_mean_ms;
  report.broker_ms = broker_ms / config.steps;
  report.transport_ms =
      report.e2e_mean_ms - report.worker_mean_ms - report.worker_handling_ms - report.broker_ms;
  return report;
}

std::string DecodeBenchTable(const DecodeBenchReport& r) {
  return absl::StrFormat(
      "service decode step: batch %d, context %d, %d steps, outputs %s, placement %s; pool: %s "
      "q_heads=%d topk=%d\n"
      "  prefill of the shared prompt      %.3f s\n"
      "  end to end per step (client)      p50 %.3f ms, mean %.3f ms, p99 %.3f ms\n"
      "  kernels per step (worker)         p50 %.3f ms, mean %.3f ms\n"
      "  service overhead (p50)            %.1f%%\n"
      "  of which (means): worker around the kernels %.3f ms, kvpoold %.3f ms, transport and "
      "wake-ups %.3f ms\n",
      r.config.batch, r.config.context, r.config.steps, OutputsName(r.config.outputs),
      r.config.placement, r.spec.DebugString(), r.model.num_q_heads, r.model.topk,
      r.prefill_seconds, r.e2e_p50_ms, r.e2e_mean_ms,
      r.e2e_p99_ms, r.worker_p50_ms, r.worker_mean_ms, 100.0 * r.overhead_fraction(),
      r.worker_handling_ms, r.broker_ms, r.transport_ms);
}

std::string DecodeBenchJson(const DecodeBenchReport& r, const std::string& date,
                            const std::string& host, const std::string& device) {
  return absl::StrFormat(
      "{\n  \"bench\": \"service-decode-step\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"device\": \"%s\",\n  \"pool\": \"%s\",\n  \"q_heads\": %d,\n  \"topk\": %d,\n"
      "  \"batch\": %d,\n  \"context\": %d,\n  \"steps\": %d,\n  \"outputs\": \"%s\",\n"
      "  \"placement\": \"%s\",\n"
      "  \"e2e_p50_ms\": %.4f,\n  \"e2e_mean_ms\": %.4f,\n  \"e2e_p99_ms\": %.4f,\n"
      "  \"worker_p50_ms\": %.4f,\n  \"worker_mean_ms\": %.4f,\n  \"overhead_p50\": %.4f,\n"
      "  \"worker_handling_ms\": %.4f,\n  \"broker_ms\": %.4f,\n  \"transport_ms\": %.4f\n}\n",
      date, host, device, r.spec.DebugString(), r.model.num_q_heads, r.model.topk,
      r.config.batch, r.config.context, r.config.steps, OutputsName(r.config.outputs),
      r.config.placement, r.e2e_p50_ms, r.e2e_mean_ms, r.e2e_p99_ms, r.worker_p50_ms, r.worker_mean_ms,
      r.overhead_fraction(), r.worker_handling_ms, r.broker_ms, r.transport_ms);
}

}  // namespace kvp
