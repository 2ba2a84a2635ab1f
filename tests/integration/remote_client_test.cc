// kvpoold's tcp:// endpoint (docs/design.md §8): CURVE only, and only for the client keys it lists.
// Real processes on the host backend, as in service_test.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/curve.h"
#include "protocol/dealer.h"
#include "tests/integration/malformed_messages.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

using ::testing::HasSubstr;

// Key pairs for kvpoold, a listed client and an unlisted one, as files in a temporary directory.
class Keys {
 public:
  Keys() {
    char dir[] = "/tmp/kvpool-keys-XXXXXX";
    dir_ = ::mkdtemp(dir);
    server_ = *NewCurveKeyPair();
    listed_ = *NewCurveKeyPair();
    unlisted_ = *NewCurveKeyPair();
    EXPECT_TRUE(WriteCurveKeyFile(server_secret(), server_.secret_key, 0600).ok());
    EXPECT_TRUE(
        WriteCurveKeyFile(clients(), "# admitted clients\n" + listed_.public_key, 0600).ok());
  }
  ~Keys() { std::filesystem::remove_all(dir_); }

  std::string server_secret() const { return dir_ + "/server"; }
  std::string clients() const { return dir_ + "/clients"; }
  CurveClientKeys listed() const { return {server_.public_key, listed_}; }
  CurveClientKeys unlisted() const { return {server_.public_key, unlisted_}; }

 private:
  std::string dir_;
  CurveKeyPair server_, listed_, unlisted_;
};

struct RemoteService {
  Keys keys;
  std::string endpoint = absl::StrCat("tcp://127.0.0.1:", FreePort());
  std::unique_ptr<ServiceProcesses> processes;

  RemoteService() {
    ServiceOptions options;
    options.daemon_flags = {absl::StrCat("--tcp_endpoint=", endpoint),
                            absl::StrCat("--curve_secret_key_file=", keys.server_secret()),
                            absl::StrCat("--curve_clients_file=", keys.clients())};
    absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) processes = std::move(*s);
  }

  ClientOptions Remote(const std::string& name, std::optional<CurveClientKeys> curve) const {
    ClientOptions o;
    o.endpoint = endpoint;
    o.name = name;
    o.timeout_ms = 2000;
    o.curve = std::move(curve);
    return o;
  }
};

TEST(RemoteClientTest, AListedKeyIsServedAndOthersAreNot) {
  RemoteService service;
  ASSERT_NE(service.processes, nullptr);

  Client remote(service.Remote("remote", service.keys.listed()));
  absl::StatusOr<PrefillResult> prefill = remote.Prefill(1, std::vector<int32_t>(100, 7));
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->length, 100);
  absl::StatusOr<DecodeResult> decode =
      remote.Decode({DecodeStepRequest{1, 8, std::nullopt, nullptr, nullptr}});
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->steps.at(0).length, 101);
  EXPECT_TRUE(remote.Release(1).ok());

  Client unlisted(service.Remote("unlisted", service.keys.unlisted()));
  absl::Status s = unlisted.Health().status();
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  Client plain(service.Remote("plain", std::nullopt));
  s = plain.Health().status();
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;

  // Refusing them cost nobody else anything.
  EXPECT_TRUE(remote.Health().ok());
  Client local(service.processes->client_options("local"));
  EXPECT_TRUE(local.Health().ok());
}

TEST(RemoteClientTest, PeersCannotTakeNamesAcrossEndpointsAndRemotesCannotRegister) {
  RemoteService service;
  ASSERT_NE(service.processes, nullptr);
  Client local(service.processes->client_options("same-name"));
  ASSERT_TRUE(local.Prefill(5, std::vector<int32_t>(70, 3)).ok());

  Client remote(service.Remote("same-name", service.keys.listed()));
  EXPECT_FALSE(remote.Release(5).ok());  // another lease's sequence
  EXPECT_TRUE(local.Release(5).ok());
  // Nor the other way round: a local routing id spelled like kvpoold's name for a remote peer.
  ASSERT_TRUE(remote.Prefill(6, std::vector<int32_t>(70, 4)).ok());
  Client spoof(service.processes->client_options("tcp/same-name"));
  EXPECT_FALSE(spoof.Release(6).ok());
  EXPECT_TRUE(remote.Release(6).ok());

  zmq::context_t context(1);
  const CurveClientKeys keys = service.keys.listed();
  Dealer dealer(context, service.endpoint, "worker-decode-1-1", &keys);
  EnvelopeBuilder request(1);
  request.envelope().getBody().initRegister().setRole(wire::Role::DECODE);
  const absl::Status s = dealer.Call(request, 5000).status();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("local ipc:// endpoint"));
}

TEST(RemoteClientTest, MalformedMessagesFromAnAdmittedKeyGetTypedErrors) {
  RemoteService service;
  ASSERT_NE(service.processes, nullptr);
  zmq::context_t context(1);
  const CurveClientKeys keys = service.keys.listed();
  Dealer raw(context, service.endpoint, "", &keys);
  for (const MalformedMessage& m : MalformedMessages()) {
    const absl::Status s = ExpectRefused(raw, m);
    EXPECT_TRUE(s.ok()) << s;
  }
  Client remote(service.Remote("after", keys));
  EXPECT_TRUE(remote.Prefill(1, std::vector<int32_t>(30, 2)).ok()) << "kvpoold still serves";
}

TEST(RemoteClientTest, KvpooldRefusesToStartAnUnauthenticatedTcpEndpoint) {
  Keys keys;
  const std::vector<std::string> base = {"--backend=host", "--arena_mib=16", "--layers=1",
                                         "--topk=64", "--metrics_port=-1"};
  const std::string tcp = absl::StrCat("--tcp_endpoint=tcp://127.0.0.1:", FreePort());
  const auto exit_status = [&](std::vector<std::string> extra) {
    std::vector<std::string> flags = base;
    flags.insert(flags.end(), extra.begin(), extra.end());
    absl::StatusOr<int> status = ServiceProcesses::RunDaemonToExit(flags, 10'000);
    return status.ok() ? *status : -1;
  };
  EXPECT_EQ(exit_status({tcp}), 1);  // no keys
  EXPECT_EQ(exit_status({tcp, absl::StrCat("--curve_secret_key_file=", keys.server_secret())}), 1);
  const std::string nobody = keys.server_secret() + ".nobody";
  ASSERT_TRUE(WriteCurveKeyFile(nobody, "# no clients yet", 0600).ok());
  EXPECT_EQ(exit_status({tcp, absl::StrCat("--curve_secret_key_file=", keys.server_secret()),
                         absl::StrCat("--curve_clients_file=", nobody)}),
            1);  // an endpoint that admits nobody is a mistake
  EXPECT_EQ(exit_status({absl::StrCat("--endpoint=tcp://127.0.0.1:", FreePort())}), 1);
}

}  // namespace
}  // namespace kvp::testing
