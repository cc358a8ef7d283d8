// sam-node: models, tools and agents served by name (docs/sam-node.md).
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "common/cli_error.h"
#include "common/log.h"
#include "common/read_file.h"
#include "sam-node/config.h"
#include "sam-node/http.h"
#include "sam-node/metrics.h"
#include "sam-node/node.h"
#include "sam-node/secrets.h"

namespace {

struct Options {
  std::string socket_path;
  std::string config;
  std::string data_dir = "/var/lib/sam";
  std::string metrics_addr;
  std::string bind_addr;
  std::string jwt_path;
  bool jwt_path_given = false;
  std::string socket_group;
  std::string log_level = "info";
};

// Exit codes: 0 stopped by a signal, 1 could not serve, 2 bad flags or configuration.
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// A platform token (a JWT) is a few KiB; anything much larger is not one.
constexpr size_t kMaxTokenBytes = 64 << 10;

// One JSON line, as sam-box's refusal to start is (a second, plain copy only repeated it).
int fail(int code, const std::string& message) {
  common::log::error("sam-node cannot start", {{"error", message}});
  return code;
}

// One secret reference: its syntax is a start-up error (a typo must not become a 502 at the
// first request); a value that cannot be read now is only a warning, since values are read
// when used and may appear later (a rotated file, a keyring unlocked after boot).
void checkSecret(const samnode::SecretStore& secrets, const std::string& field,
                 const std::string& ref) {
  try {
    secrets.validate(ref);
  } catch (const samnode::SecretError& e) {
    throw samnode::ConfigError(field + ": " + e.what());
  }
  try {
    static_cast<void>(secrets.read(ref));
  } catch (const samnode::SecretError& e) {
    common::log::warn(
        "secret not readable now; requests that need it fail with "
        "secret-unavailable until it is",
        {{"field", field},
         {"error", e.what()},
         {"hint",
          "the value is a reference (a file NAME under <data-dir>/secrets, file:///path, "
          "env://VAR or keyring://ITEM), never the secret itself"}});
  }
}

// Every secret reference the configuration names, checked before serving.
void validateSecrets(const samnode::Config& config, const samnode::SecretStore& secrets) {
  for (size_t i = 0; i < config.services.size(); ++i) {
    if (!config.services[i].api_key.empty()) {
      checkSecret(secrets, "services[" + std::to_string(i) + "].api_key",
                  config.services[i].api_key);
    }
  }
  for (size_t i = 0; i < config.secrets.size(); ++i) {
    checkSecret(secrets, "secrets[" + std::to_string(i) + "].ref", config.secrets[i].ref);
  }
}

// Whether `program` can be executed as posix_spawnp(3) would find it (a name with a slash as
// it is, a bare name on PATH).
bool executable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/bin:/bin";
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    if (::access(((dir.empty() ? "." : dir) + "/" + program).c_str(), X_OK) == 0) return true;
    dirs = colon == std::string_view::npos ? "" : dirs.substr(colon + 1);
  }
  return false;
}

// The spawn templates' runner and bundles, looked at before serving: like a secret's value,
// they are read when used and may appear later, so what is missing now is a warning that
// names the field, not a 502 found at the first spawn.
void checkSpawnTemplates(const samnode::Config& config) {
  if (config.spawn.empty()) return;
  if (!executable(config.runner)) {
    common::log::warn("runner not found; spawn fails with spawn-failed until it is",
                      {{"field", "runner"}, {"runner", config.runner}});
  }
  for (size_t i = 0; i < config.spawn.size(); ++i) {
    std::string why;
    if (!common::readRegularFile(config.spawn[i].bundle, 1 << 20, &why)) {
      common::log::warn("spawn template's bundle not readable now; its spawns fail until it is",
                        {{"field", "spawn[" + std::to_string(i) + "].bundle"},
                         {"bundle", config.spawn[i].bundle},
                         {"error", why}});
    }
  }
}

int run(const Options& opts) {
  if (!opts.bind_addr.empty())
    return fail(kExitUsage,
                "--bind-addr: only \"\" is accepted: this node does not join a mesh (not built)");
  if (opts.jwt_path_given) {
    // The seed's pod hands the node its platform token for the mesh. A path that is not a
    // readable regular file is a deployment error, said now; a readable one is not used (no
    // mesh), and that is said too rather than ignored.
    std::string why = "empty path";
    if (opts.jwt_path.empty() || !common::readRegularFile(opts.jwt_path, kMaxTokenBytes, &why))
      return fail(kExitUsage, "--jwt-path: cannot read '" + opts.jwt_path + "': " + why);
    common::log::info("--jwt-path is not used: this node joins no mesh (--bind-addr \"\")",
                      {{"jwt_path", opts.jwt_path}});
  }
  gid_t socket_gid = 0;
  if (!opts.socket_group.empty()) {
    const struct group* g = ::getgrnam(opts.socket_group.c_str());  // single-threaded here
    if (g == nullptr)
      return fail(kExitUsage, "--socket-group: no such group '" + opts.socket_group + "'");
    socket_gid = g->gr_gid;
  }
  const char* provider_env = std::getenv("COMPASS_SECRET_PROVIDER");
  const std::string provider = provider_env && *provider_env ? provider_env : "file";
  std::unique_ptr<samnode::Node> node;
  try {
    samnode::Config config = samnode::loadConfig(opts.config);
    samnode::SecretStore secrets(opts.data_dir, provider);
    validateSecrets(config, secrets);
    checkSpawnTemplates(config);
    node = std::make_unique<samnode::Node>(std::move(config), std::move(secrets));
  } catch (const samnode::ConfigError& e) {
    return fail(kExitUsage, e.what());
  } catch (const samnode::SecretError& e) {
    return fail(kExitUsage, std::string("COMPASS_SECRET_PROVIDER: ") + e.what());
  }

  // SIGTERM/SIGINT/SIGHUP are taken by one thread with sigwait(): blocked here, before any
  // other thread exists, so every thread inherits the mask and none is interrupted by them.
  // SIGHUP stops cleanly too (there is no reload; its default action would leave the socket).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    std::optional<samnode::MetricsListener> metrics;
    if (!opts.metrics_addr.empty()) metrics.emplace(node->metrics, opts.metrics_addr);
    samnode::McpAggregator mcp(*node);
    samnode::A2aDirectory a2a(*node);
    samnode::Operations ops(*node);
    samnode::HttpServer server(
        opts.socket_path,
        [&](const samnode::Request& req, samnode::ResponseWriter& out) {
          samnode::dispatch(*node, mcp, a2a, ops, req, out);
        },
        [&](std::string_view reason) { node->metrics.refusal(reason); });
    struct stat ours {};  // our socket, to remove at the end only if it is still ours
    ::stat(opts.socket_path.c_str(), &ours);
    if (!opts.socket_group.empty()) {
      // The socket was made 0600; widened to the group only now, and only to it (the boxes
      // that assert agents' identities run in it; sam-node itself runs as another user).
      // chown only when needed: a unit whose primary group is already GROUP need not be
      // allowed chown(2) at all (systemd's ~@privileged filter denies it).
      struct stat st {};
      if (::stat(opts.socket_path.c_str(), &st) != 0 ||
          (st.st_gid != socket_gid &&
           ::chown(opts.socket_path.c_str(), static_cast<uid_t>(-1), socket_gid) != 0) ||
          ::chmod(opts.socket_path.c_str(), 0660) != 0) {
        return fail(kExitFailure, "--socket-group " + opts.socket_group + ": cannot give " +
                                      opts.socket_path + " to the group: " + std::strerror(errno));
      }
    }
    a2a.start();
    std::thread signals([&] {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      common::log::info("sam-node stopping", {{"signal", sig}});
      server.stop();
    });
    common::log::info("sam-node serving", {{"socket", opts.socket_path},
                                           {"services", node->config.services.size()},
                                           {"roles", node->config.roles.size()},
                                           {"metrics_port", metrics ? metrics->port() : 0}});
    server.serve();
    // serve() also returns on an accept loop failure: wake the signal thread to end it.
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    // No socket file left behind: a later client would take it for a live node.
    struct stat now {};
    if (::stat(opts.socket_path.c_str(), &now) == 0 && now.st_ino == ours.st_ino &&
        now.st_dev == ours.st_dev) {
      ::unlink(opts.socket_path.c_str());
    }
  } catch (const std::invalid_argument& e) {
    return fail(kExitUsage, e.what());
  } catch (const std::exception& e) {
    return fail(kExitFailure, e.what());
  }
  common::log::info("sam-node stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sam-node: models, tools and agents served by name (docs/sam-node.md)", "sam-node"};
  app.set_version_flag("--version", std::string("sam-node ") + COMPASS_VERSION);
  app.require_subcommand(1);
  Options opts;
  CLI::App* cmd = app.add_subcommand("run", "serve the node API on a Unix socket");
  cmd->add_option("--socket-path", opts.socket_path, "the API socket (created mode 0600)")
      ->required();
  cmd->add_option("--config", opts.config,
                  "the YAML configuration (default: DATA_DIR/sam-node.yaml)");
  cmd->add_option("--data-dir", opts.data_dir, "where file secrets named without a path live")
      ->capture_default_str();
  cmd->add_option("--metrics-addr", opts.metrics_addr,
                  "loopback HOST:PORT for Prometheus /metrics (default: off)");
  cmd->add_option("--bind-addr", opts.bind_addr,
                  "mesh listener: only \"\" (not built) (default: \"\")")
      ->expected(0, 1);  // the seed writes `--bind-addr=`: an empty value
  cmd->add_option("--socket-group", opts.socket_group,
                  "also let this group's members connect (socket mode 0660; the node must be "
                  "in the group) (default: none, mode 0600)");
  CLI::Option* jwt_path =
      cmd->add_option("--jwt-path", opts.jwt_path,
                      "the node's platform token file (seed 003's pod); checked readable, not used "
                      "without a mesh (default: none)");
  cmd->add_option("--log-level", opts.log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return common::reportParseError(app, e, "sam-node", kExitUsage);
  }
  opts.jwt_path_given = jwt_path->count() > 0;
  if (opts.config.empty()) opts.config = opts.data_dir + "/sam-node.yaml";
  common::log::init("sam-node", common::log::parseLevel(opts.log_level));
  return run(opts);
}
