#include "bench/broker_bench.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "base/malloc_tuning.h"
#include "base/status_macros.h"
#include "daemon/broker.h"
#include "kernels/capabilities.h"
#include "protocol/capabilities_codec.h"
#include "protocol/outputs_codec.h"
#include "protocol/status_codec.h"

namespace kvp::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Hands `request` to the broker as peer `from`; the one message it sends back (or to a worker).
absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Exchange(Broker& broker, const std::string& from,
                                                         const EnvelopeBuilder& request,
                                                         double* micros) {
  Outbox out;
  std::vector<zmq::message_t> frames = request.Frame();
  const auto t0 = Clock::now();
  broker.Handle(from, std::move(frames), out);
  if (micros != nullptr) *micros = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (out.size() != 1) return absl::InternalError("expected one message from the broker");
  ASSIGN_OR_RETURN(auto reply, ParseEnvelope(std::move(out[0].frames)));
  if (reply->envelope().getBody().isError()) {
    return StatusFromWire(reply->envelope().getBody().getError());
  }
  return reply;
}

}  // namespace

absl::StatusOr<BrokerBenchResult> RunBrokerBench(const BrokerBenchConfig& config) {
  KeepFreedMemoryForReuse();  // as kvpoold does
  spdlog::set_level(spdlog::level::warn);
  BrokerBenchResult result;
  result.config = config;
  PoolSpec spec;
  spec.num_layers = 61;
  spec.indexer = true;
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
  const int64_t blocks = BlocksForTokens(config.context, spec.block_size) +
                         int64_t{config.batch} * (config.steps / spec.block_size + 2) + 16;
  SteadyClock clock;
  ASSIGN_OR_RETURN(std::unique_ptr<PoolSet> pools,
                   PoolSet::Create(spec, blocks * layout.block_stride(), 1, &clock, 60'000'000));
  BrokerOptions options;
  options.model.topk = 2048;
  Broker broker(pools.get(), &clock, options);

  EnvelopeBuilder reg(1);
  auto r = reg.envelope().getBody().initRegister();
  r.setRole(wire::Role::DECODE);
  ServedToWire(kHostCapabilities.Decode(), r.initCapabilities().initHostArena());
  RETURN_IF_ERROR(Exchange(broker, "worker", reg, nullptr).status());

  // One prompt, written by an "engine" (append + commit), forked to the whole batch.
  EnvelopeBuilder append(2);
  auto a = append.envelope().getBody().initAppend();
  a.setSequence(0);
  auto tokens = a.initTokens(config.context);
  for (int i = 0; i < config.context; ++i) tokens.set(i, i % 32000);
  RETURN_IF_ERROR(Exchange(broker, "client", append, nullptr).status());
  EnvelopeBuilder commit(3);
  commit.envelope().getBody().initCommit().setSequence(0);
  RETURN_IF_ERROR(Exchange(broker, "client", commit, nullptr).status());
  for (int i = 1; i < config.batch; ++i) {
    EnvelopeBuilder fork(4);
    auto f = fork.envelope().getBody().initFork();
    f.setSource(0);
    f.setTarget(static_cast<uint64_t>(i));
    RETURN_IF_ERROR(Exchange(broker, "client", fork, nullptr).status());
  }

  std::vector<DecodeStepResult> last(config.batch);
  for (DecodeStepResult& s : last) {
    s.out.assign(1, std::vector<float>(32 * 128, 0.5f));
    s.topk.assign(1, std::vector<int32_t>(2048, 7));
  }
  std::vector<double> plan, finish, finish_last;
  for (int step = 0; step < config.steps; ++step) {
    EnvelopeBuilder request(100 + step);
    auto d = request.envelope().getBody().initDecode();
    const bool with_outputs = step % 2 == 1;
    d.setOutputLayers(with_outputs ? wire::OutputLayers::LAST : wire::OutputLayers::NONE);
    auto steps = d.initSteps(config.batch);
    for (int i = 0; i < config.batch; ++i) {
      steps[i].setSequence(static_cast<uint64_t>(i));
      steps[i].setToken(step);
      auto n = steps[i].initNeedle();
      n.setPosition(static_cast<uint64_t>(step * 97 % config.context));
      n.setGain(0.35f);
    }
    double us = 0;
    ASSIGN_OR_RETURN(auto job, Exchange(broker, "client", request, &us));
    plan.push_back(us);
    result.job_bytes = job->envelope().totalSize().wordCount * 8;  // the last, steady-state step
    const auto job_steps = job->envelope().getBody().getDecodeJob().getSteps();
    EnvelopeBuilder done(job->request_id());
    auto jd = done.envelope().getBody().initJobDone();
    jd.setJob(job->envelope().getBody().getDecodeJob().getJob());
    if (with_outputs) {
      for (int i = 0; i < config.batch; ++i) last[i].sequence = job_steps[i].getSequence();
      DecodeResultsToWire(last, 32, 128, jd.initOutputs(config.batch));
    } else {
      auto outs = jd.initOutputs(config.batch);
      for (int i = 0; i < config.batch; ++i) outs[i].setSequence(job_steps[i].getSequence());
    }
    RETURN_IF_ERROR(Exchange(broker, "worker", done, &us).status());
    (with_outputs ? finish_last : finish).push_back(us);
  }
  result.plan_us = Median(plan);
  result.finish_us = Median(finish);
  result.finish_last_us = Median(finish_last);
  return result;
}

std::string BrokerTable(const BrokerBenchResult& r) {
  return absl::StrFormat(
      "kvpoold's broker per decode step, batch %d forked from a %d-token prompt, %d steps\n"
      "  plan (request in, %d-byte job out)      %8.1f us\n"
      "  finish, lengths only                     %8.1f us\n"
      "  finish, last layer's outputs and top-k   %8.1f us\n",
      r.config.batch, r.config.context, r.config.steps, r.job_bytes, r.plan_us, r.finish_us,
      r.finish_last_us);
}

std::string BrokerJson(const BrokerBenchResult& r, const std::string& date,
                       const std::string& host) {
  return absl::StrFormat(
      "{\n  \"bench\": \"broker\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n  \"batch\": %d,\n"
      "  \"context\": %d,\n  \"steps\": %d,\n  \"job_bytes\": %d,\n  \"plan_us\": %.2f,\n"
      "  \"finish_us\": %.2f,\n  \"finish_last_us\": %.2f\n}\n",
      date, host, r.config.batch, r.config.context, r.config.steps, r.job_bytes, r.plan_us,
      r.finish_us, r.finish_last_us);
}

}  // namespace kvp::bench
