#include "daemon/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvp {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void Histogram::Observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  if (it != bounds_.end()) ++counts_[it - bounds_.begin()];
  sum_ += value;
  ++count_;
}

std::vector<double> JobLatencyBounds() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5,
          10,   30};
}

namespace {

// `seconds` into the latency histogram of `key`, made on first use.
void ObserveLatency(std::map<std::string, Histogram>& histograms, const std::string& key,
                    double seconds) {
  auto it = histograms.find(key);
  if (it == histograms.end()) it = histograms.emplace(key, Histogram(JobLatencyBounds())).first;
  it->second.Observe(seconds);
}

}  // namespace

void BrokerMetrics::ObserveJob(const std::string& kind, const std::string& outcome,
                               double seconds) {
  ++jobs[{kind, outcome}];
  ObserveLatency(job_seconds, kind, seconds);
}

void BrokerMetrics::ObserveMigration(const std::string& transport, bool ok, uint64_t bytes,
                                     double seconds) {
  ++migrations[{transport, ok ? "ok" : "error"}];
  migrated_bytes[transport] += bytes;
  ObserveLatency(migration_seconds, transport, seconds);
}

namespace {

void Header(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string Number(double v) { return absl::StrFormat("%.9g", v); }

// One histogram family: a histogram per value of `label`.
void Histograms(std::string& out, const char* name, const char* help, const char* label,
                const std::map<std::string, Histogram>& by_label) {
  Header(out, name, "histogram", help);
  for (const auto& [value, h] : by_label) {
    const std::string key = absl::StrCat(label, "=\"", value, "\"");
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds().size(); ++i) {
      cumulative += h.counts()[i];
      absl::StrAppend(&out, name, "_bucket{", key, ",le=\"", Number(h.bounds()[i]), "\"} ",
                      cumulative, "\n");
    }
    absl::StrAppend(&out, name, "_bucket{", key, ",le=\"+Inf\"} ", h.count(), "\n");
    absl::StrAppend(&out, name, "_sum{", key, "} ", Number(h.sum()), "\n");
    absl::StrAppend(&out, name, "_count{", key, "} ", h.count(), "\n");
  }
}

}  // namespace

std::string RenderPrometheus(const BrokerMetrics& m, const PoolGauges& g) {
  std::string out;
  // Per pool: `pool` is its index, `gpu` its device (host for memfd pools).
  const auto labels = [&](size_t i) {
    const int gpu = g.pools[i].gpu;
    return absl::StrCat("pool=\"", i, "\",gpu=\"", gpu < 0 ? "host" : absl::StrCat(gpu), "\"");
  };
  Header(out, "kvpool_blocks", "gauge", "Blocks of each pool by state.");
  for (size_t i = 0; i < g.pools.size(); ++i) {
    const PoolCounts& c = g.pools[i].blocks;
    const std::pair<const char*, int64_t> states[] = {
        {"free", c.free}, {"reserved", c.reserved}, {"used", c.used}, {"cached", c.cached}};
    for (const auto& [state, n] : states) {
      absl::StrAppend(&out, "kvpool_blocks{", labels(i), ",state=\"", state, "\"} ", n, "\n");
    }
  }
  Header(out, "kvpool_leases", "gauge", "Live leases (workers and clients).");
  absl::StrAppend(&out, "kvpool_leases ", g.leases, "\n");
  Header(out, "kvpool_sequences", "gauge", "Sequences in each pool (a move in flight counts at both ends).");
  for (size_t i = 0; i < g.pools.size(); ++i) {
    absl::StrAppend(&out, "kvpool_sequences{", labels(i), "} ", g.pools[i].sequences, "\n");
  }
  Header(out, "kvpool_workers", "gauge", "Registered workers of each pool by role.");
  for (size_t i = 0; i < g.pools.size(); ++i) {
    // Both roles always, 0 included: an alert on a missing role needs the series to exist.
    for (const char* role : {"prefill", "decode"}) {
      const auto it = g.pools[i].workers.find(role);
      absl::StrAppend(&out, "kvpool_workers{", labels(i), ",role=\"", role, "\"} ",
                      it == g.pools[i].workers.end() ? 0 : it->second, "\n");
    }
  }
  Header(out, "kvpool_migrations_total", "counter",
         "Sequences moved between pools, by transport and outcome.");
  for (const auto& [key, n] : m.migrations) {
    absl::StrAppend(&out, "kvpool_migrations_total{transport=\"", key.first, "\",outcome=\"",
                    key.second, "\"} ", n, "\n");
  }
  Header(out, "kvpool_migrated_bytes_total", "counter", "Bytes moved between pools, by transport.");
  for (const auto& [transport, n] : m.migrated_bytes) {
    absl::StrAppend(&out, "kvpool_migrated_bytes_total{transport=\"", transport, "\"} ", n, "\n");
  }
  Histograms(out, "kvpool_migration_seconds",
             "Time from planning a move between pools to its commit (or failure), by transport.",
             "transport", m.migration_seconds);
  Header(out, "kvpool_evicted_blocks_total", "counter",
         "Cached (prefix) blocks of each pool evicted to make room for new ones.");
  for (size_t i = 0; i < g.pools.size(); ++i) {
    absl::StrAppend(&out, "kvpool_evicted_blocks_total{", labels(i), "} ", g.pools[i].evicted,
                    "\n");
  }
  Header(out, "kvpool_jobs_queued", "gauge", "Jobs waiting for a worker.");
  absl::StrAppend(&out, "kvpool_jobs_queued ", g.jobs_queued, "\n");
  Header(out, "kvpool_jobs_running", "gauge", "Jobs a worker is executing.");
  absl::StrAppend(&out, "kvpool_jobs_running ", g.jobs_running, "\n");
  Header(out, "kvpool_draining", "gauge", "1 while kvpoold drains before exiting.");
  absl::StrAppend(&out, "kvpool_draining ", g.draining ? 1 : 0, "\n");
  Header(out, "kvpool_recovered_sequences", "gauge",
         "Sequences the last start kept from the state log (--state_dir).");
  absl::StrAppend(&out, "kvpool_recovered_sequences ", g.recovered_sequences, "\n");
  Header(out, "kvpool_recovered_blocks", "gauge",
         "Committed blocks the last start kept from the state log (--state_dir).");
  absl::StrAppend(&out, "kvpool_recovered_blocks ", g.recovered_blocks, "\n");
  Header(out, "kvpool_recovery_seconds", "gauge",
         "Seconds from the last start to serving, recovery included.");
  absl::StrAppend(&out, "kvpool_recovery_seconds ", g.recovery_micros / 1e6, "\n");

  Header(out, "kvpool_layer_k_scale", "gauge", "K scale of each layer (stored = E4M3(k / scale)).");
  for (size_t l = 0; l < g.k_scales.size(); ++l) {
    absl::StrAppend(&out, "kvpool_layer_k_scale{layer=\"", l, "\"} ", Number(g.k_scales[l]), "\n");
  }
  Header(out, "kvpool_layer_v_scale", "gauge", "V scale of each layer's TurboNV group scales.");
  for (size_t l = 0; l < g.v_scales.size(); ++l) {
    absl::StrAppend(&out, "kvpool_layer_v_scale{layer=\"", l, "\"} ", Number(g.v_scales[l]), "\n");
  }
  Header(out, "kvpool_layer_sliding_window_tokens", "gauge",
         "Sliding window of each layer's dense decode, in tokens (0: all positions).");
  for (size_t l = 0; l < g.sliding_windows.size(); ++l) {
    absl::StrAppend(&out, "kvpool_layer_sliding_window_tokens{layer=\"", l, "\"} ",
                    g.sliding_windows[l], "\n");
  }
  Header(out, "kvpool_sparse_v_threshold", "gauge", "Sparse-V threshold tau (0: exact).");
  absl::StrAppend(&out, "kvpool_sparse_v_threshold ", Number(g.sparse_v_threshold), "\n");
  Header(out, "kvpool_client_max_blocks", "gauge", "Blocks one client may hold (0: no limit).");
  absl::StrAppend(&out, "kvpool_client_max_blocks ", g.client_max_blocks, "\n");
  Header(out, "kvpool_client_max_requests", "gauge",
         "Prefill and decode requests one client may have in flight.");
  absl::StrAppend(&out, "kvpool_client_max_requests ", g.client_max_requests, "\n");
  Header(out, "kvpool_requests_total", "counter", "Requests received, by kind.");
  for (const auto& [kind, n] : m.requests) {
    absl::StrAppend(&out, "kvpool_requests_total{kind=\"", kind, "\"} ", n, "\n");
  }
  Header(out, "kvpool_error_replies_total", "counter", "Error replies, by status code.");
  for (const auto& [code, n] : m.errors) {
    absl::StrAppend(&out, "kvpool_error_replies_total{code=\"", code, "\"} ", n, "\n");
  }
  Header(out, "kvpool_jobs_total", "counter", "Jobs finished, by kind and outcome.");
  for (const auto& [key, n] : m.jobs) {
    absl::StrAppend(&out, "kvpool_jobs_total{kind=\"", key.first, "\",outcome=\"", key.second,
                    "\"} ", n, "\n");
  }
  Histograms(out, "kvpool_job_seconds", "Time from request to reply of worker jobs.", "kind",
             m.job_seconds);
  Header(out, "kvpool_jobs_requeued_total", "counter", "Jobs re-sent after their worker died.");
  absl::StrAppend(&out, "kvpool_jobs_requeued_total ", m.jobs_requeued, "\n");
  Header(out, "kvpool_leases_reaped_total", "counter", "Leases that expired and were reaped.");
  absl::StrAppend(&out, "kvpool_leases_reaped_total ", m.leases_reaped, "\n");
  Header(out, "kvpool_migration_streamed_blocks_total", "counter",
         "Blocks of prefills moved to their decode pool while the prefill was still written.");
  absl::StrAppend(&out, "kvpool_migration_streamed_blocks_total ", m.streamed_blocks, "\n");
  Header(out, "kvpool_prefix_hit_blocks_total", "counter", "Blocks reused by prefix hits.");
  absl::StrAppend(&out, "kvpool_prefix_hit_blocks_total ", m.prefix_hit_blocks, "\n");
  Header(out, "kvpool_prefix_hit_tokens_total", "counter", "Tokens not written thanks to prefix hits.");
  absl::StrAppend(&out, "kvpool_prefix_hit_tokens_total ", m.prefix_hit_tokens, "\n");
  Header(out, "kvpool_prefix_query_tokens_total", "counter",
         "Tokens of prefills and appends looked up in the prefix cache (hits over queries: the "
         "hit rate).");
  absl::StrAppend(&out, "kvpool_prefix_query_tokens_total ", m.prefix_query_tokens, "\n");
  Header(out, "kvpool_nonfinite_rejections_total", "counter",
         "Requests refused for NaN or Inf in their tensors.");
  absl::StrAppend(&out, "kvpool_nonfinite_rejections_total ", m.rejected_nonfinite, "\n");
  Header(out, "kvpool_client_limit_rejections_total", "counter",
         "Requests refused because a client reached a per-client limit, by limit.");
  for (const char* limit : {"blocks", "requests"}) {
    const auto it = m.limit_refusals.find(limit);
    absl::StrAppend(&out, "kvpool_client_limit_rejections_total{limit=\"", limit, "\"} ",
                    it == m.limit_refusals.end() ? 0 : it->second, "\n");
  }
  return out;
}

}  // namespace kvp
