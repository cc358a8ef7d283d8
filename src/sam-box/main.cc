// sam-box: the per-agent egress boundary (seed 003). `sam-box run …` serves named CONNECT and
// connect-udp tunnels on a Unix socket and decides each by the name the agent asked for.

#include "common/cli_error.h"
#include "common/log.h"
#include "common/socket_path.h"
#include "sam-box/credential_watch.h"
#include "sam-box/limits.h"
#include "sam-box/options.h"
#include "sam-box/server.h"
#include "sam-box/verifier.h"

#include <sys/resource.h>
#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include <algorithm>
#include <csignal>
#include <optional>

#include <iostream>

namespace {

constexpr int kExitConfig = 2;    // the configuration was refused
constexpr int kExitIdentity = 3;  // the platform credential did not verify
constexpr int kExitRuntime = 1;   // a listener could not be bound, or the loop failed

// Each flow holds up to kFdsPerFlow descriptors; the usual soft limit (1024) would stop the
// boundary at ~170 flows, far below kMaxConcurrentFlows. Raise it, and the hard limit too where
// the process may (CAP_SYS_RESOURCE: a sam-box started by the runner as root), else as far as
// the hard limit allows; say so when that is still short (setrlimit(2)).
void raiseFileLimit() {
  constexpr rlim_t kWanted = sambox::kMaxConcurrentFlows * sambox::kFdsPerFlow + 64;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < kWanted) {
    const rlimit raised{kWanted, std::max<rlim_t>(kWanted, lim.rlim_max)};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      lim = raised;
    } else {
      lim.rlim_cur = std::min<rlim_t>(kWanted, lim.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
  }
  if (lim.rlim_cur < kWanted) {
    common::log::warn(
        "RLIMIT_NOFILE is below what the flow cap needs; accepts will be refused "
        "by the kernel before the cap is reached",
        {{"nofile", lim.rlim_cur}, {"wanted", kWanted}});
  }
}

/// An io_context whose parked handlers (the coroutine frames of open flows) can be destroyed
/// before the io_context itself: those frames refer to the Server (metrics, the flow count),
/// which is destroyed first.
class IoContext : public asio::io_context {
 public:
  using asio::io_context::io_context;
  /// Shuts the services down, destroying every pending handler. Safe to repeat (the
  /// destructor does it again); I/O objects may be destroyed afterwards.
  void destroyPendingWork() { shutdown(); }
};

void fail(const std::string& what, const std::string& reason) {
  common::log::error(what, {{"reason", reason}});
}

int run(const sambox::Flags& flags) {
  common::log::init("sam-box", common::log::parseLevel(flags.log_level));
  sambox::Config config;
  try {
    config = sambox::buildConfig(flags);
  } catch (const std::exception& e) {
    fail(std::string("refusing to start: ") + e.what(), "config");
    return kExitConfig;
  }
  sambox::IdentityCheck check;
  const std::string verifier = sambox::verifierPath();
  sambox::Verdict verdict;
  std::string verified_token;
  if (config.verifyCredential()) {
    check.issuer = flags.credential_issuer;
    check.audience = flags.credential_audience;
    check.token_path = flags.credential_path;
    check.ca_file = flags.credential_ca;
    check.expected_subject = config.bundle->external_id;
    // The bytes read here are the ones verified (on the helper's stdin); a later change of
    // the file is the recheck's (credential_watch.h).
    verdict = sambox::verifyTokenFile(verifier, check, &verified_token);
    if (!verdict.ok) {
      fail("refusing to start: credential not accepted: " + verdict.detail, verdict.reason);
      return kExitIdentity;
    }
    common::log::info("credential verified", {{"issuer", verdict.issuer},
                                              {"subject", verdict.subject},
                                              {"agent", config.agentId()},
                                              {"expires_at", verdict.expires_at}});
  } else if (config.bundle) {
    common::log::warn(
        "--insecure-unverified-bundle: the bundle is not checked against a platform credential, "
        "so whoever can write " +
            flags.bundle + " decides which agent this sandbox is",
        {{"agent", config.agentId()}});
  } else {
    common::log::warn(
        "no --bundle: this box asserts no agent identity; mesh.sam.alt is refused "
        "(no-agent-identity) and only --egress-allow names are reachable");
  }

  raiseFileLimit();
  IoContext io(1);
  sambox::Server server(io, config);
  struct DestroyFlowsFirst {
    IoContext& io;
    ~DestroyFlowsFirst() { io.destroyPendingWork(); }
  } destroy_flows_first{io};
  try {
    server.start();
  } catch (const std::exception& e) {
    fail(std::string("refusing to start: ") + e.what(), "listen");
    return kExitRuntime;
  }
  std::optional<sambox::CredentialWatch> watch;
  if (config.verifyCredential()) {
    watch.emplace(io, check, verifier, verdict, std::move(verified_token),
                  [&server](bool lapsed) { server.setIdentityLapsed(lapsed); });
    watch->start();
  }
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const asio::error_code& ec, int signo) {
    if (ec) return;
    if (watch) watch->stop();
    // Open flows are ended (not dropped): each writes its line, then the loop stops.
    common::log::info("stopping", {{"signal", signo}, {"open_flows", server.openFlows()}});
    server.stop([&io] { io.stop(); });
  });
  if (config.allowlist.empty()) {
    common::log::warn(
        "the egress allowlist is empty: every external name is refused "
        "(pure default-deny); add names with egress.allow or --egress-allow");
  }
  if (!flags.sidecar_socket.empty() && !common::isSocket(flags.sidecar_socket)) {
    // Not a refusal: the node may still be starting beside us (a pod).
    common::log::warn(
        "--sidecar-socket is no socket (yet): mesh.sam.alt flows are answered "
        "502 node-unavailable until the node serves it",
        {{"sidecar_socket", flags.sidecar_socket}});
  }
  std::vector<std::string> rules;
  for (const auto& r : config.allowlist.rules()) rules.push_back(r.text());
  common::log::info("ready", {{"socket", flags.socket},
                              {"agent", config.agentId()},
                              {"egress_allow", rules},
                              {"sidecar_socket", flags.sidecar_socket},
                              {"metrics_addr", flags.metrics_addr},
                              {"ingress_listen", config.ingress ? flags.ingress_listen : ""}});
  try {
    io.run();
  } catch (const std::exception& e) {
    fail(std::string("event loop failed: ") + e.what(), "runtime");
    server.stop();
    return kExitRuntime;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a peer that goes away is an ordinary end of a flow
  CLI::App app{
      "sam-box: the per-agent egress boundary. Serves named CONNECT and connect-udp "
      "tunnels on a Unix socket and decides each by name.",
      "sam-box"};
  app.set_version_flag("--version", std::string("sam-box ") + COMPASS_VERSION);
  app.require_subcommand(1);
  sambox::Flags flags;
  CLI::App* run_cmd = app.add_subcommand("run", "Run the boundary for one agent");
  run_cmd->add_option("--socket", flags.socket, "Unix socket the sandbox's tunnels arrive on")
      ->required();
  run_cmd->add_option("--sidecar-socket", flags.sidecar_socket,
                      "sam-node's API socket; mesh.sam.alt requests are forwarded there "
                      "(default: none: mesh.sam.alt is refused)");
  run_cmd->add_option("--bundle", flags.bundle,
                      "Agent bundle (YAML, version v1) (default: none: no agent identity)");
  run_cmd->add_option("--credential-issuer", flags.credential_issuer,
                      "OIDC issuer (https URL) of the platform credential (default: none)");
  run_cmd->add_option("--credential-audience", flags.credential_audience,
                      "Audience the credential must name (default: none)");
  run_cmd->add_option("--credential-path", flags.credential_path, "Platform token file")
      ->capture_default_str();
  run_cmd->add_option("--credential-ca", flags.credential_ca,
                      "PEM CA bundle for the issuer's HTTPS (default: system store)");
  run_cmd->add_flag("--insecure-unverified-bundle", flags.insecure_unverified_bundle,
                    "Skip the credential check: whoever can write the bundle decides the agent");
  run_cmd->add_option("--metrics-addr", flags.metrics_addr,
                      "Prometheus listener host:port (default: none)");
  run_cmd->add_option("--egress-allow", flags.egress_allow,
                      "Allowed name, *.name, name:port (repeatable; adds to the bundle's list) "
                      "(default: none)");
  run_cmd
      ->add_option("--ingress-listen", flags.ingress_listen,
                   "host:port for requests to the bundle's `serves` service")
      ->capture_default_str();
  run_cmd->add_option("--agent-ingress-socket", flags.agent_ingress_socket,
                      "Socket nano-init --ingress-socket serves (required with `serves`) "
                      "(default: none)");
  run_cmd->add_option("--allow-destination", flags.allow_destination,
                      "CIDR an allowed name may resolve into despite being loopback, link-local, "
                      "multicast or unspecified (repeatable) (default: none)");
  run_cmd
      ->add_option("--resolve-cache-ttl", flags.resolve_cache_ttl,
                   "Seconds a name's answer is reused by later flows (0: look up every flow)")
      ->capture_default_str();
  run_cmd->add_option("--log-level", flags.log_level, "debug, info, warn or error")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return common::reportParseError(app, e, "sam-box", kExitConfig);
  }
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::cerr << "sam-box: " << e.what() << "\n";
    return kExitConfig;
  }
}
