#include "client/control_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "client/percentile.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

LatencySummary Summarize(std::vector<double> us) {
  LatencySummary s;
  if (us.empty()) return s;
  s.p50_us = Percentile(us, 0.5);
  s.p99_us = Percentile(us, 0.99);
  double total = 0;
  for (double v : us) total += v;
  s.mean_us = total / us.size();
  s.per_second = 1e6 / s.mean_us;
  return s;
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void RunEchoServer(const std::string& endpoint, int messages) {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, 10'000);
  router.bind(endpoint);
  for (int i = 0; i < messages; ++i) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(router, std::back_inserter(frames))) return;
    zmq::send_multipart(router, frames);
  }
}

// A ROUTER echo in another process over ipc://, as kvpoold is: the same hops and wake-ups, none
// of kvpoold's work. Round trips through it interleave with kvpoold's, so both see the same noise.
class BareEcho {
 public:
  static absl::StatusOr<std::unique_ptr<BareEcho>> Start(int messages) {
    std::unique_ptr<BareEcho> e(new BareEcho());
    e->dir_ = std::filesystem::temp_directory_path() / absl::StrCat("kvpool-bare-", ::getpid());
    std::filesystem::create_directories(e->dir_);
    const std::string endpoint = absl::StrCat("ipc://", e->dir_, "/echo.sock");
    e->child_ = ::fork();
    if (e->child_ < 0) return absl::InternalError("fork failed");
    if (e->child_ == 0) {
      // Only this thread exists here; a fresh context, never the parent's.
      RunEchoServer(endpoint, messages);
      ::_exit(0);
    }
    e->dealer_.set(zmq::sockopt::linger, 0);
    e->dealer_.set(zmq::sockopt::rcvtimeo, 10'000);
    e->dealer_.connect(endpoint);
    return e;
  }
  ~BareEcho() {
    dealer_.close();
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  absl::StatusOr<double> RoundTrip(const std::string& payload) {
    const auto t0 = Clock::now();
    dealer_.send(zmq::buffer(payload));
    zmq::message_t reply;
    if (!dealer_.recv(reply)) return absl::InternalError("the echo process stopped answering");
    return Micros(Clock::now() - t0);
  }

 private:
  BareEcho() = default;
  std::string dir_;
  pid_t child_ = -1;
  zmq::context_t context_{1};
  zmq::socket_t dealer_{context_, zmq::socket_type::dealer};
};

}  // namespace

absl::StatusOr<ControlBenchReport> RunControlBench(
    Client& client, int requests, const std::function<void(int64_t, int64_t)>& progress) {
  ASSIGN_OR_RETURN(PoolHealth health, client.Health());
  const std::vector<int32_t> tokens(health.spec.block_size, 7);
  ControlBenchReport report;
  report.requests = requests;
  {
    EnvelopeBuilder probe = client.NewRequest();
    auto a = probe.envelope().getBody().initAppend();
    a.initTokens(tokens.size());
    for (const auto& f : probe.Frame()) report.message_bytes += f.size();
  }
  std::vector<double> bare_us, append_us, commit_us;
  const std::string payload(report.message_bytes, 'x');
  ASSIGN_OR_RETURN(std::unique_ptr<BareEcho> echo, BareEcho::Start(requests + 1));
  RETURN_IF_ERROR(echo->RoundTrip(payload).status());  // connects
  const uint64_t base = (uint64_t{1} << 62) + static_cast<uint64_t>(::getpid()) * 1'000'000;
  for (int i = 0; i < requests; ++i) {
    const uint64_t seq = base + i;
    ASSIGN_OR_RETURN(double bare, echo->RoundTrip(payload));
    bare_us.push_back(bare);
    auto t0 = Clock::now();
    ASSIGN_OR_RETURN(AppendResult appended, client.Append(seq, tokens));
    append_us.push_back(Micros(Clock::now() - t0));
    t0 = Clock::now();
    RETURN_IF_ERROR(client.Commit(seq).status());
    commit_us.push_back(Micros(Clock::now() - t0));
    RETURN_IF_ERROR(client.Release(seq).status());
    if ((i + 1) % 1000 == 0 || i + 1 == requests) progress(i + 1, requests);
  }
  report.bare = Summarize(std::move(bare_us));
  report.append = Summarize(std::move(append_us));
  report.commit = Summarize(std::move(commit_us));
  return report;
}

std::string ControlBenchTable(const ControlBenchReport& r) {
  std::string out = absl::StrFormat(
      "control plane over ipc://, %d requests each, %d-byte append message\n"
      "  %-22s %10s %10s %10s %12s %10s\n",
      r.requests, r.message_bytes, "round trip", "p50 us", "p99 us", "mean us", "requests/s",
      "p50 / bare");
  auto row = [&](const char* name, const LatencySummary& s) {
    absl::StrAppend(&out, absl::StrFormat("  %-22s %10.1f %10.1f %10.1f %12.0f %9.2fx\n", name,
                                          s.p50_us, s.p99_us, s.mean_us, s.per_second,
                                          s.p50_us / r.bare.p50_us));
  };
  row("bare ZeroMQ echo", r.bare);
  row("append (reserve)", r.append);
  row("commit", r.commit);
  return out;
}

std::string ControlBenchJson(const ControlBenchReport& r, const std::string& date,
                             const std::string& host) {
  auto obj = [](const LatencySummary& s) {
    return absl::StrFormat(
        "{\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"per_second\": %.0f}",
        s.p50_us, s.p99_us, s.mean_us, s.per_second);
  };
  return absl::StrFormat(
      "{\n  \"bench\": \"control-plane\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"transport\": \"ipc\",\n  \"requests\": %d,\n  \"message_bytes\": %d,\n"
      "  \"bare_zmq\": %s,\n  \"append\": %s,\n  \"commit\": %s,\n"
      "  \"append_p50_vs_bare\": %.3f,\n  \"commit_p50_vs_bare\": %.3f\n}\n",
      date, host, r.requests, r.message_bytes, obj(r.bare), obj(r.append), obj(r.commit),
      r.append.p50_us / r.bare.p50_us, r.commit.p50_us / r.bare.p50_us);
}

}  // namespace kvp
