#include "compass-runner/microvm_reap.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "compass-runner/microvm_backend.h"
#include "compass-runner/sam_box_process.h"
#include "compass-runner/state.h"

namespace runner::microvm {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> cmdlineOf(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  return argv;
}

// The -pidfile of a qemu-system-* command line, "" if it is none.
std::string pidfileOf(const std::vector<std::string>& argv) {
  if (argv.empty() || fs::path(argv[0]).filename().string().rfind("qemu-system-", 0) != 0) {
    return "";
  }
  for (size_t i = 1; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-pidfile") return argv[i + 1];
  }
  return "";
}

// Every running QEMU with a -pidfile, as (pid, pidfile).
std::vector<std::pair<int, std::string>> allGuests() {
  std::vector<std::pair<int, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    // Only our own QEMUs: a look-alike command line in another user's process is not one.
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    const std::string pidfile = pidfileOf(cmdlineOf(n));
    if (!pidfile.empty()) out.emplace_back(std::stoi(n), pidfile);
  }
  return out;
}

bool gone(int pid) {
  ::waitpid(pid, nullptr, WNOHANG);  // ours (same runner) or not
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

void killAndWait(int pid) {
  ::kill(pid, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!gone(pid) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::vector<int> qemuProcessesIn(const std::string& state_dir) {
  std::vector<int> out;
  const std::string want = state_dir + "/" + kPidFile;
  for (const auto& [pid, pidfile] : allGuests()) {
    if (pidfile == want) out.push_back(pid);
  }
  return out;
}

void reapAgent(const std::string& id, const std::string& state_dir, int sam_box_pid) noexcept {
  (void)id;
  try {
    for (int pid : qemuProcessesIn(state_dir)) killAndWait(pid);
    const std::string socket = state_dir + "/" + kSocketFile;
    if (sam_box_pid > 0 && isSamBoxFor(sam_box_pid, socket)) killSamBox(sam_box_pid);
    for (const auto& [pid, sock] : samBoxesUnder(state_dir)) killSamBox(pid);
  } catch (const std::exception& e) {
    (void)std::fprintf(stderr, "compass-runner: gc: microvm agent %s: %s\n", id.c_str(), e.what());
  }
}

void reapOrphanGuests(const std::string& root, const std::vector<std::string>& live_ids) {
  const std::set<std::string> live(live_ids.begin(), live_ids.end());
  // As podman_reap.cc: a record is asked for after the listing, so a runner started since
  // `live_ids` was read (its agent.json comes before its QEMU and sam-box) is left alone.
  auto orphan = [&](const std::string& id) {
    return !id.empty() && live.count(id) == 0 && !hasRecordFile(root + "/" + id);
  };
  std::set<std::string> dead;
  auto idUnderRoot = [&](const std::string& path) -> std::string {
    if (path.rfind(root + "/", 0) != 0) return "";
    const std::string rest = path.substr(root.size() + 1);
    const std::string id = rest.substr(0, rest.find('/'));
    return isAgentId(id) ? id : "";
  };
  for (const auto& [pid, pidfile] : allGuests()) {
    const std::string id = idUnderRoot(pidfile);
    if (orphan(id)) dead.insert(id);
  }
  for (const auto& [pid, sock] : samBoxesUnder(root)) {
    const std::string id = idUnderRoot(sock);
    if (orphan(id)) dead.insert(id);
  }
  for (const auto& id : dead) {
    const std::string dir = std::string(root).append("/").append(id);
    reapAgent(id, dir, -1);
    std::error_code ec;
    if (!fs::exists(dir + "/agent.json", ec) && fs::exists(dir + "/" + kPidFile, ec)) {
      removeStateDir(dir);
      std::printf("removed microvm leftovers of %s: %s\n", id.c_str(), dir.c_str());
    }
  }
}

}  // namespace runner::microvm
