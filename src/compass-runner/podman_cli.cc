#include "compass-runner/podman_cli.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "compass-runner/podman_userns.h"

namespace runner::podman {
namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> podmanArgv(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"podman"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> podmanEnv(const std::string& conf) { return {"CONTAINERS_CONF=" + conf}; }

std::string memoryFlag(uint64_t bytes) { return std::to_string(bytes) + "b"; }

std::string cpusFlag(double cpus) {
  std::ostringstream out;
  out.precision(6);
  out << std::fixed << cpus;
  std::string s = out.str();
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::vector<std::string> runArgs(const RunSpec& spec) {
  const std::string idmap =
      "0:" + std::to_string(spec.id_base) + ":" + std::to_string(kIdsPerAgent);
  std::vector<std::string> a = {
      "run",
      "--name",
      spec.name,
      "--label",
      std::string(kAgentLabel) + "=" + spec.agent_id,
      "--network",
      "ns:" + spec.netns_path,
      "--uidmap",
      idmap,
      "--gidmap",
      idmap,
      "--user",
      spec.user,
      "--cap-drop",
      "all",
      "--security-opt",
      "no-new-privileges",
      // The container's /sys is the host's (runc cannot mount a sysfs for a netns that its
      // user namespace does not own): its net views would list the host's interfaces and
      // every other agent's veth. Masked (an empty read-only tmpfs over each).
      "--security-opt",
      std::string("mask=") + kMaskedSysNet,
      "--no-hosts",
      // Nothing the image says runs beside the agent or outlives it: no healthcheck (podman
      // would `exec` the image's command on a timer, outside nano-init), no anonymous volume
      // for the image's VOLUMEs (left behind by every run), and the stop signal is SIGTERM
      // whatever the image's STOPSIGNAL, so `stop` reaches the agent as documented.
      "--no-healthcheck",
      "--image-volume",
      "ignore",
      "--stop-signal",
      "SIGTERM",
      "--pull",
      "never",
      "--pids-limit",
      std::to_string(spec.resources.pids.value_or(kDefaultPids)),
  };
  if (spec.pass_fds > 0) a.insert(a.end(), {"--preserve-fds", std::to_string(spec.pass_fds)});
  for (const auto& d : spec.dns) a.insert(a.end(), {"--dns", d});
  // No search domain: podman would copy the host's `search` line, which tells the agent the
  // host's domain and multiplies every refused lookup by its length.
  if (!spec.dns.empty()) a.insert(a.end(), {"--dns-search", "."});
  if (spec.resources.memory_bytes) {
    // Swap equal to memory: the limit is the limit (podman's default doubles it).
    const std::string m = memoryFlag(*spec.resources.memory_bytes);
    a.insert(a.end(), {"--memory", m, "--memory-swap", m});
  }
  if (spec.resources.cpus) a.insert(a.end(), {"--cpus", cpusFlag(*spec.resources.cpus)});
  for (const auto& m : spec.mounts) {
    a.insert(a.end(), {"--volume", m.host + ":" + m.container + (m.read_only ? ":ro" : "")});
  }
  if (!spec.workdir.empty()) a.insert(a.end(), {"--workdir", spec.workdir});
  if (!spec.pidfile.empty()) a.insert(a.end(), {"--pidfile", spec.pidfile});
  if (!spec.argv.empty()) a.insert(a.end(), {"--entrypoint", spec.argv.front()});
  if (!spec.rootfs.empty()) {
    a.insert(a.end(), {"--rootfs", spec.rootfs});
  } else {
    a.push_back(spec.image);
  }
  if (!spec.argv.empty()) a.insert(a.end(), spec.argv.begin() + 1, spec.argv.end());
  return a;
}

std::vector<std::string> updateArgs(const std::string& container, const Resources& r) {
  std::vector<std::string> a;
  if (r.memory_bytes) {
    const std::string m = memoryFlag(*r.memory_bytes);
    a.insert(a.end(), {"--memory", m, "--memory-swap", m});
  }
  if (r.cpus) a.insert(a.end(), {"--cpus", cpusFlag(*r.cpus)});
  if (a.empty()) return a;
  a.insert(a.begin(), "update");
  a.push_back(container);
  return a;
}

CommandResult run(const std::string& conf, const std::vector<std::string>& args,
                  std::chrono::milliseconds timeout) {
  return runCommand(podmanArgv(args), "", timeout, "", podmanEnv(conf));
}

std::string runChecked(const std::string& what, const std::string& conf,
                       const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  return ::runner::runChecked(what, podmanArgv(args), "", timeout, "", podmanEnv(conf));
}

bool containerExists(const std::string& conf, const std::string& name) {
  const CommandResult r = run(conf, {"container", "exists", name});
  if (r.status == 0) return true;
  if (r.status == 1) return false;
  throw RunnerError("podman container exists " + name + ": exit " + std::to_string(r.status) +
                    ": " + trimmed(r.err));
}

bool removeContainer(const std::string& conf, const std::string& name) noexcept {
  try {
    // With --ignore, podman-rm(1) exits 0 once no such container exists: removed now, or
    // gone already. Only a failure needs the second podman start (about 80 ms) to tell: an
    // rm racing podman's own clean-up of the exited container can fail on its busy shm mount
    // and still leave it removed.
    if (run(conf, {"rm", "--force", "--volumes", "--time", "0", "--ignore", name}).status == 0) {
      return true;
    }
    return !containerExists(conf, name);
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<std::string> agentContainers(const std::string& conf) {
  const std::string out =
      runChecked("podman ps", conf,
                 {"ps", "--all", "--filter", std::string("label=") + kAgentLabel, "--format",
                  std::string("{{index .Labels \"") + kAgentLabel + "\"}}"});
  std::vector<std::string> ids;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) ids.push_back(line);
  }
  return ids;
}

void setPidsLimit(pid_t pid, uint64_t pids) {
  // /proc/<pid>/cgroup: "N:pids:/path" (v1) or "0::/path" (v2).
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  if (!in) throw RunnerError("resize --pids: process " + std::to_string(pid) + " is gone");
  std::string file;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':');
    const size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers == "pids") file = "/sys/fs/cgroup/pids" + path + "/pids.max";
    if (controllers.empty() && file.empty()) file = "/sys/fs/cgroup" + path + "/pids.max";
  }
  if (file.empty())
    throw RunnerError("resize --pids: no pids cgroup for pid " + std::to_string(pid));
  std::ofstream out(file);
  out << pids << "\n";
  out.flush();
  if (!out) throw RunnerError("resize --pids: write " + file + ": " + std::strerror(errno));
}

}  // namespace runner::podman
