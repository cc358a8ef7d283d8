#include "compass-runner/options.h"

#include "common/cli_error.h"

#include <sys/sysinfo.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "policy/allowlist.h"
#include "policy/bundle.h"
#include "sam-box/options.h"

namespace runner {
namespace {

constexpr size_t kMaxUnixPath = 107;  // sizeof(sockaddr_un::sun_path) - 1

std::string quoted(std::string_view flag, std::string_view text) {
  return std::string(flag) + " \"" + std::string(text) + "\"";
}

bool allDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Reads the bundle once (so the strict parse and the `egress` key check see the same text),
// with the same size cap as policy::loadBundle.
std::string readBundleText(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    throw RunnerError(quoted("--bundle", path) + ": no such file");
  }
  if (ec) throw RunnerError(quoted("--bundle", path) + ": " + ec.message());
  if (st.type() != std::filesystem::file_type::regular) {
    throw RunnerError(quoted("--bundle", path) + ": not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError(quoted("--bundle", path) + ": cannot be opened: " + std::strerror(errno));
  }
  std::string text;
  text.resize(policy::kMaxBundleBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > policy::kMaxBundleBytes) {
    throw RunnerError(quoted("--bundle", path) + ": larger than " +
                      std::to_string(policy::kMaxBundleBytes) + " bytes");
  }
  return text;
}

// Loads the bundle into `spec`: agent.id, and egress.allow appended to the allowlist. A bundle
// with an `egress` key (even `egress: {}`) is a configured policy: the host tier must refuse it
// rather than run as if it were not there (seed 002, "host").
void applyBundle(const std::string& path, AgentSpec& spec, std::vector<policy::AllowRule>& rules) {
  const std::string text = readBundleText(path);
  policy::Bundle bundle;
  try {
    bundle = policy::parseBundle(text);
  } catch (const policy::BundleError& e) {
    throw RunnerError(quoted("--bundle", path) + ": " + e.what());
  }
  // parseBundle() accepted the text, so it is one YAML mapping; only the key is looked at.
  const YAML::Node doc = YAML::Load(text);
  if (doc.IsMap() && doc["egress"]) spec.egress_configured = true;
  if (bundle.serves) {
    // Serving needs sam-box's ingress wired to nano-init's --ingress-socket and a node that
    // routes to it; the runner does not do that yet, and must not run as if it did.
    throw RunnerError(quoted("--bundle", path) +
                      ": serves: agents that serve are not supported by compass-runner yet "
                      "(no ingress is wired to the sandbox); remove the serves section");
  }
  spec.agent_id = bundle.agent_id;
  spec.external_id = bundle.external_id;
  for (auto& rule : bundle.egress_allow) rules.push_back(std::move(rule));
  spec.bundle_path = std::filesystem::absolute(path).string();
}

std::string absoluteDirectory(std::string_view flag, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    throw RunnerError(quoted(flag, path) + ": not a directory");
  }
  return std::filesystem::absolute(path).lexically_normal().string();
}

// An existing regular file for a --credential-* flag, made absolute (sam-box reads it later,
// from another working directory).
std::string credentialFile(std::string_view flag, const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    throw RunnerError(quoted(flag, path) + ": no such file");
  }
  if (ec) throw RunnerError(quoted(flag, path) + ": " + ec.message());
  if (st.type() != std::filesystem::file_type::regular) {
    throw RunnerError(quoted(flag, path) + ": not a regular file");
  }
  return std::filesystem::absolute(path).lexically_normal().string();
}

// The --credential-* flags (seed 003, "Identity"): all or nothing of issuer and audience, and
// only where there is a bundle to verify and a sam-box to verify it.
void checkCredential(AgentSpec& spec) {
  Credential& c = spec.credential;
  if (c.issuer.empty()) {
    for (const auto& [flag, value] :
         {std::pair{"--credential-audience", &c.audience}, std::pair{"--credential-path", &c.path},
          std::pair{"--credential-ca", &c.ca}}) {
      if (!value->empty()) {
        throw RunnerError(std::string(flag) +
                          ": needs --credential-issuer (the issuer whose token proves the "
                          "bundle's agent.external_id)");
      }
    }
    return;
  }
  constexpr std::string_view kHttps = "https://";
  const std::string_view rest = std::string_view(c.issuer).substr(
      c.issuer.rfind(kHttps, 0) == 0 ? kHttps.size() : c.issuer.size());
  if (rest.empty() || rest.front() == '/' || std::any_of(rest.begin(), rest.end(), [](char ch) {
        return static_cast<unsigned char>(ch) <= ' ' || ch == 0x7f;
      })) {
    throw RunnerError(quoted("--credential-issuer", c.issuer) +
                      ": must be an https:// URL with a host and no spaces (discovery and keys "
                      "are fetched over TLS)");
  }
  if (c.audience.empty()) {
    throw RunnerError(
        "--credential-issuer needs --credential-audience (the audience the "
        "platform token was issued for)");
  }
  if (spec.bundle_path.empty()) {
    throw RunnerError(
        "--credential-issuer needs --bundle: the credential proves the bundle's "
        "agent.external_id, and without a bundle there is no identity to prove");
  }
  if (spec.external_id.empty()) {
    throw RunnerError(quoted("--bundle", spec.bundle_path) +
                      ": agent.external_id: required with --credential-issuer (the token's "
                      "subject must match it)");
  }
  if (spec.egress == Posture::kFirewall) {
    throw RunnerError(
        "--credential-issuer: egress firewall has no sam-box to verify the "
        "credential and assert the identity; use --egress boundary");
  }
  if (c.path.empty()) {
    // sam-box would read its default only once podman runs; the operator hears it now.
    std::error_code ec;
    if (!std::filesystem::is_regular_file(sambox::kDefaultCredentialPath, ec)) {
      throw RunnerError(std::string("--credential-path: not given, and its default \"") +
                        sambox::kDefaultCredentialPath +
                        "\" (the projected service account token) is not a regular file on "
                        "this host; give the platform token's file");
    }
  } else {
    c.path = credentialFile("--credential-path", c.path);
  }
  if (!c.ca.empty()) c.ca = credentialFile("--credential-ca", c.ca);
}

// Checks the flags of `run` that the parser leaves as text and fills the spec.
void finishRun(RunOptions& run, const std::vector<std::string>& allow, bool allow_given,
               bool egress_given, const std::string& egress, const std::string& memory,
               const std::string& cpus, const std::string& pids) {
  AgentSpec& spec = run.spec;
  std::vector<policy::AllowRule> rules;
  if (allow_given) spec.egress_configured = true;
  bool stated_empty = false;
  for (const auto& entry : allow) {
    // `--egress-allow ""` states an explicitly empty allowlist (pure default-deny); it adds
    // no rule but still counts as a configured policy.
    if (entry.empty()) {
      stated_empty = true;
      continue;
    }
    try {
      rules.push_back(policy::parseAllowRule(entry));
    } catch (const policy::AllowRuleError& e) {
      throw RunnerError(quoted("--egress-allow", entry) + ": " + e.what());
    }
  }
  const bool names_given = !rules.empty();
  if (!spec.bundle_path.empty()) applyBundle(spec.bundle_path, spec, rules);
  if (stated_empty && !rules.empty()) {
    // An explicitly empty allowlist beside names says two things; neither is guessed.
    throw RunnerError(quoted("--egress-allow", "") +
                      ": states an empty allowlist, but the allowlist also holds \"" +
                      rules.front().text() + "\"" +
                      (names_given ? " from --egress-allow" : " from --bundle") +
                      "; give --egress-allow \"\" alone, or only the names to allow");
  }
  for (const auto& rule : rules) {
    std::string text = rule.text();
    if (std::find(spec.egress_allow.begin(), spec.egress_allow.end(), text) ==
        spec.egress_allow.end()) {
      spec.egress_allow.push_back(std::move(text));
    }
  }
  if (egress_given) {
    spec.egress_configured = true;
    if (egress == "boundary") {
      spec.egress = Posture::kBoundary;
    } else if (egress == "firewall") {
      spec.egress = Posture::kFirewall;
    } else {
      throw RunnerError(quoted("--egress", egress) + ": expected boundary or firewall");
    }
  }
  checkCredential(spec);
  if (!memory.empty()) spec.resources.memory_bytes = parseBytes("--memory", memory);
  if (!cpus.empty()) spec.resources.cpus = parseCpus("--cpus", cpus);
  if (!pids.empty()) spec.resources.pids = parsePids("--pids", pids);
  if (!spec.rootfs.empty()) {
    spec.rootfs = absoluteDirectory("--rootfs", spec.rootfs);
    // Refused here rather than by runc's "open …/etc/resolv.conf: permission denied" (an empty
    // directory, a wrong path): podman mounts the sandbox's resolv.conf and hosts into etc/.
    std::error_code ec;
    if (!std::filesystem::is_directory(std::filesystem::path(spec.rootfs) / "etc", ec)) {
      throw RunnerError(quoted("--rootfs", spec.rootfs) +
                        ": not a root filesystem: it has no etc/ directory (the agent's "
                        "/etc/resolv.conf and /etc/hosts are mounted there)");
    }
  }
  if (!spec.workdir.empty() && spec.workdir.front() != '/') {
    throw RunnerError(quoted("--workdir", spec.workdir) + ": must be an absolute path");
  }
  // podman joins --workdir to the root's path on the host before cleaning it, so a `..` that
  // climbs past `/` would be looked up (and accepted) outside the agent's root.
  for (const auto& part : std::filesystem::path(spec.workdir)) {
    if (part == "..") {
      throw RunnerError(quoted("--workdir", spec.workdir) +
                        ": must not contain \"..\" (name the directory itself)");
    }
  }
  if (!spec.sidecar_socket.empty() && spec.sidecar_socket.size() > kMaxUnixPath) {
    throw RunnerError(quoted("--sidecar-socket", spec.sidecar_socket) +
                      ": a Unix socket path must be at most 107 bytes");
  }
  if (spec.command.empty()) throw RunnerError("run: CMD is required after `--`");
  if (spec.command.front().empty()) throw RunnerError("run: CMD must not be empty");
}

void finishResize(ResizeOptions& resize, const std::string& memory, const std::string& cpus,
                  const std::string& pids) {
  if (!memory.empty()) resize.resources.memory_bytes = parseBytes("--memory", memory);
  if (!cpus.empty()) resize.resources.cpus = parseCpus("--cpus", cpus);
  if (!pids.empty()) resize.resources.pids = parsePids("--pids", pids);
  if (!resize.resources.memory_bytes && !resize.resources.cpus && !resize.resources.pids) {
    throw RunnerError("resize: give at least one of --memory, --cpus, --pids");
  }
}

}  // namespace

uint64_t parseBytes(std::string_view flag, std::string_view text) {
  std::string_view digits = text;
  unsigned shift = 0;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        break;
    }
    if (shift != 0) digits.remove_suffix(1);
  }
  uint64_t value = 0;
  const auto* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (allDigits(digits) && ec == std::errc::result_out_of_range) {
    throw RunnerError(quoted(flag, text) + ": more than the 1 TiB this runner accepts");
  }
  if (!allDigits(digits) || ec != std::errc() || ptr != end) {
    throw RunnerError(quoted(flag, text) +
                      ": expected a byte count, digits with an optional k, m or g suffix "
                      "(binary: 512m = 512 MiB)");
  }
  if (value == 0) throw RunnerError(quoted(flag, text) + ": must be more than zero");
  if (value > (kMaxMemoryBytes >> shift)) {
    throw RunnerError(quoted(flag, text) + ": more than the 1 TiB this runner accepts");
  }
  if ((value << shift) < kMinMemoryBytes) {
    throw RunnerError(quoted(flag, text) +
                      ": less than 6 MiB, the least any tier runs (runc's minimum; the microvm "
                      "tier needs 128 MiB)");
  }
  return value << shift;
}

double parseCpus(std::string_view flag, std::string_view text) {
  double value = 0;
  const auto* end = text.data() + text.size();
  const bool shaped = !text.empty() && text.front() != '+' && text.front() != '-' &&
                      text.find_first_not_of("0123456789.") == std::string_view::npos;
  if (!shaped || std::from_chars(text.data(), end, value).ptr != end || !std::isfinite(value)) {
    throw RunnerError(quoted(flag, text) + ": expected a decimal number of CPUs, e.g. 1.5");
  }
  const int online = get_nprocs();
  if (value < 0.01 || value > online) {
    throw RunnerError(quoted(flag, text) + ": must be from 0.01 to " + std::to_string(online) +
                      " (the CPUs online)");
  }
  return value;
}

uint64_t parsePids(std::string_view flag, std::string_view text) {
  uint64_t value = 0;
  const auto* end = text.data() + text.size();
  if (!allDigits(text) || text.size() > 10 || std::from_chars(text.data(), end, value).ptr != end ||
      value < kMinPids || value > kMaxPids) {
    throw RunnerError(quoted(flag, text) + ": expected a task count from " +
                      std::to_string(kMinPids) + " (nano-init and the agent) to " +
                      std::to_string(kMaxPids));
  }
  return value;
}

Command parseCommandLine(int argc, const char* const* argv) {
  CLI::App app{
      "compass-runner: runs one AI agent in the tier you choose (host, podman, microvm), "
      "contained as that tier promises, and keeps the roster of live agents.",
      "compass-runner"};
  app.set_version_flag("--version", std::string("compass-runner ") + COMPASS_VERSION);
  app.require_subcommand(1);

  RunOptions run;
  std::string backend, egress, memory, cpus, pids;
  std::vector<std::string> allow;
  auto* run_cmd = app.add_subcommand(
      "run", "Run one agent in the foreground; exits with its status (128+N for signal N)");
  auto* backend_opt = run_cmd->add_option(
      "--backend", backend,
      "Tier: podman, microvm or host (default: $COMPASS_RUNTIME_BACKEND, else podman; the "
      "flag wins)");
  run_cmd->add_option("--bundle", run.spec.bundle_path,
                      "Agent bundle (YAML v1): agent.id and egress.allow are used (default: none)");
  auto* allow_opt =
      run_cmd
          ->add_option("--egress-allow", allow,
                       "Allowed name, *.name or name:port (repeatable; adds to the bundle's "
                       "egress.allow). \"\" states an empty allowlist (default: none)")
          ->allow_extra_args(false);
  auto* egress_opt =
      run_cmd->add_option("--egress", egress,
                          "Egress mechanism: boundary or firewall (default: the tier's: boundary "
                          "on podman and microvm; the host tier has none)");
  auto* image_opt = run_cmd->add_option(
      "--image", run.spec.image,
      std::string("Image to run (podman, microvm) (default: ") + image::kDefaultImage + ")");
  auto* rootfs_opt = run_cmd->add_option("--rootfs", run.spec.rootfs,
                                         "Directory to use as the root file system instead of "
                                         "an image (podman, microvm) (default: none)");
  image_opt->excludes(rootfs_opt);
  rootfs_opt->excludes(image_opt);
  run_cmd->add_option("--memory", memory,
                      "Memory limit in bytes, or with k/m/g suffix (binary) (default: none; "
                      "microvm: 512m)");
  run_cmd->add_option("--cpus", cpus, "CPU limit, may be fractional (default: none)");
  run_cmd->add_option("--pids", pids, "Task limit (default: none)");
  run_cmd->add_option("--workdir", run.spec.workdir,
                      "Absolute working directory of CMD (default: host tier: the current "
                      "directory; podman: the image's)");
  Credential& cred = run.spec.credential;
  run_cmd->add_option("--credential-issuer", cred.issuer,
                      "https:// OIDC issuer of the platform token that proves the bundle's "
                      "agent.external_id; sam-box verifies it (default: none: the bundle's "
                      "identity is NOT verified)");
  run_cmd->add_option("--credential-audience", cred.audience,
                      "Audience the token must carry; required with --credential-issuer (default: "
                      "none)");
  run_cmd->add_option("--credential-path", cred.path,
                      "Platform token file (default: sam-box's, the projected service account "
                      "token path)");
  run_cmd->add_option("--credential-ca", cred.ca,
                      "PEM CA file for the issuer's HTTPS (default: the system's CAs)");
  run_cmd->add_option(
      "--sidecar-socket", run.spec.sidecar_socket,
      "sam-node's API socket, for mesh.sam.alt; egress boundary only (default: none)");
  auto* accel_opt = run_cmd->add_option(
      "--accel", run.spec.accel,
      "microvm only: kvm, or tcg (software emulation: slow, for tests; never chosen "
      "automatically) (default: kvm)");
  run_cmd->add_option("command", run.spec.command, "CMD [ARGS…], after `--`");
  run_cmd->footer("Put CMD after `--`: compass-runner run --backend host -- sh -c 'echo hi'");

  AgentsOptions agents;
  auto* agents_cmd = app.add_subcommand(
      "agents", "List live agents: id, tier, egress posture, pid, uptime, flows, command");
  agents_cmd->add_flag("--json", agents.json, "Print a JSON array instead of a table");

  StopOptions stop;
  auto* stop_cmd = app.add_subcommand(
      "stop", "Stop a live agent: SIGTERM to its runner, which stops the agent (10 s grace)");
  stop_cmd->add_option("id", stop.id, "Agent id, as `agents` lists it")->required();

  ResizeOptions resize;
  std::string r_memory, r_cpus, r_pids;
  auto* resize_cmd = app.add_subcommand(
      "resize",
      "Change a live agent's limits (podman only: the host tier has no cgroup, a "
      "microVM's memory and vCPUs are fixed at boot)");
  resize_cmd->add_option("id", resize.id, "Agent id, as `agents` lists it")->required();
  resize_cmd->add_option("--memory", r_memory,
                         "Memory limit in bytes, or with k/m/g suffix (default: unchanged)");
  resize_cmd->add_option("--cpus", r_cpus, "CPU limit, may be fractional (default: unchanged)");
  resize_cmd->add_option("--pids", r_pids, "Task limit (default: unchanged)");

  auto* gc_cmd = app.add_subcommand(
      "gc", "Remove what dead runners left: sandboxes, netns, veths, state dirs");

  ImageBuildOptions image_build;
  auto* image_cmd = app.add_subcommand("image", "Local images (no registry is used)");
  image_cmd->require_subcommand(1);
  auto* build_cmd = image_cmd->add_subcommand(
      "build", "Build the default agent image (Debian rootfs via debootstrap, podman import)");
  build_cmd->add_flag("--force", image_build.build.force, "Rebuild even if the image exists");
  build_cmd->add_option("--name", image_build.build.name, "Image name")->capture_default_str();

  // CLI11 reports an unknown command word only as "A subcommand is required"; name it.
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word.empty() || word.front() == '-') continue;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(argv[i]);
    if (!known) {
      return Exit{kExitUsage, "compass-runner: unknown command \"" + std::string(word) +
                                  "\"; the commands are run, agents, stop, resize, gc, image "
                                  "(see --help)\n"};
    }
    break;
  }
  // `run`: everything after the first `--` is the agent's command, given to nobody's parser,
  // so a flag of the command (curl --memory …) can never be taken as the runner's.
  std::vector<std::string> after_dashes;
  bool saw_dashes = false;
  int parse_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).empty() || argv[i][0] == '-') continue;
    if (!run_cmd->check_name(argv[i])) break;
    for (int j = i + 1; j < argc; ++j) {
      if (std::string_view(argv[j]) == "--") {
        saw_dashes = true;
        parse_argc = j;
        after_dashes.assign(argv + j + 1, argv + argc);
        break;
      }
    }
    break;
  }
  try {
    app.parse(parse_argc, argv);
  } catch (const CLI::ParseError& e) {
    // A misspelt flag or command is named even where a subcommand is missing too (cli_error.h).
    const common::ParseErrorReport report =
        common::describeParseError(app, e, "compass-runner", kExitUsage);
    if (report.status == 0) return Exit{0, report.out};
    std::string msg = report.err;
    // CLI11 words a repeated single-value flag as a count ("--egress: At Most 1 required but
    // received 2"): say what the operator did instead.
    static constexpr std::string_view kAtMost = ": At Most 1 required but received ";
    if (const size_t at = msg.find(kAtMost); at != std::string::npos) {
      const size_t eol = msg.find('\n', at);
      msg = msg.substr(0, at) + ": given more than once; give it once" +
            (eol == std::string::npos ? "\n" : msg.substr(eol));
    }
    return Exit{kExitUsage, msg + report.out};
  }
  try {
    // A flag given with an empty value is a mistake, not a request for the default (only
    // --backend "" and --egress-allow "" have a meaning, documented above).
    for (const CLI::App* cmd : {run_cmd, resize_cmd, build_cmd}) {
      for (const CLI::Option* opt : cmd->get_options()) {
        if (opt == backend_opt || opt == allow_opt || opt->get_name() == "command" ||
            opt->count() == 0 || opt->get_expected_max() == 0) {
          continue;
        }
        for (const auto& value : opt->results()) {
          if (value.empty()) throw RunnerError(opt->get_name() + ": must not be empty");
        }
      }
    }
    if (*run_cmd) {
      if (!run.spec.command.empty()) {
        std::string words;
        for (const auto& w : run.spec.command) words += (words.empty() ? "" : " ") + w;
        throw RunnerError(
            "run: put the agent's command after `--` (compass-runner run [FLAGS] "
            "-- CMD [ARGS…]); \"" +
            words + "\" came before it" + (saw_dashes ? "" : " and there is no `--`"));
      }
      run.spec.command = std::move(after_dashes);
      if (backend_opt->count() > 0) run.backend = backend;
      finishRun(run, allow, allow_opt->count() > 0, egress_opt->count() > 0, egress, memory, cpus,
                pids);
      if (accel_opt->count() > 0) {
        if (run.spec.accel != "kvm" && run.spec.accel != "tcg") {
          throw RunnerError("--accel \"" + run.spec.accel + "\": expected kvm or tcg");
        }
        const char* env = std::getenv("COMPASS_RUNTIME_BACKEND");
        const std::string tier = run.backend ? *run.backend : (env != nullptr ? env : "");
        selectBackend(run.backend, env);  // a misspelt tier is named as such, not as --accel's
        if (tier != "microvm") {
          throw RunnerError("--accel: only the microvm tier has an accelerator (the tier here is " +
                            (tier.empty() ? std::string("podman, the default") : tier) + ")");
        }
      }
      return run;
    }
    if (*agents_cmd) return agents;
    if (*stop_cmd) return stop;
    if (*resize_cmd) {
      finishResize(resize, r_memory, r_cpus, r_pids);
      return resize;
    }
    if (*gc_cmd) return GcOptions{};
    if (*build_cmd) return image_build;
  } catch (const RunnerError& e) {
    return Exit{kExitUsage, std::string("compass-runner: ") + e.what() + "\n"};
  }
  return Exit{kExitUsage, "compass-runner: no command given; see --help\n"};
}

}  // namespace runner
