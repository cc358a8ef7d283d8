#pragma once
// The podman tier's containers.conf (DESIGN.md "Known facts": rootful podman, runtime runc,
// lowered default_ulimits) and the seed's pasta check (seed 002, "podman": "When agents'
// default network is pasta, the Runner refuses to start if containers.conf pasta_options
// enables one"). The parsing is pure so it is unit-tested on text, without podman.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace runner::podman {

/// The containers.conf every podman call of the runner reads (CONTAINERS_CONF). Why each line:
/// - default_ulimits: root here lacks CAP_SYS_RESOURCE, so podman's defaults (raising nofile
///   to 1048576) fail in runc;
/// - runtime runc: crun fails on this host's hybrid cgroup layout;
/// - cgroupfs: no systemd manages cgroups here (cgroup v1, no session bus);
/// - events/logs to files: no journald.
extern const char* const kContainersConf;

/// Where the runner writes kContainersConf: <stateRoot("podman")>/containers.conf.
std::string containersConfPath();

/// Writes kContainersConf to `path` (mode 0644, temp file + rename) unless it already holds
/// exactly that text. Throws RunnerError naming the path and errno.
void writeContainersConf(const std::string& path);

/// One containers.conf as read from disk.
struct ConfFile {
  std::string path;
  std::string text;
};

/// The subset of TOML (v1.0.0) that containers.conf uses: `[table]` / `[a.b]` headers,
/// `key = value` with basic ("…", with \-escapes) or literal ('…') strings, arrays of them
/// (over several lines, trailing comma allowed), and scalars (numbers, booleans) kept as their
/// text. Inline tables are skipped. Keys are "table.key" ("network.pasta_options"); a key
/// outside any table is just "key". Values: every string of an array, or the one scalar.
using TomlValues = std::map<std::string, std::vector<std::string>>;

/// Parses `file.text`. Throws RunnerError("<path>:<line>: <reason>") on what it cannot read
/// (an unterminated string or array, a line that is not a header or key = value): a file
/// podman reads and we cannot is a refusal, never a skip.
TomlValues parseToml(const ConfFile& file);

/// True if pasta's arguments `options` set up a port forward: -t/--tcp-ports, -u/--udp-ports
/// (host → namespace), -T/--tcp-ns, -U/--udp-ns (namespace → host: these reach the host's
/// loopback), with a value other than "none"; `-T5000`, `--tcp-ns=5000`, `-T 5000` and short
/// option clusters (`-4T`) all count. Elements holding spaces are split first.
bool pastaOptionsForward(const std::vector<std::string>& options);

/// The seed's VerifyNoPastaForwards, pure: `files` in the order podman reads them (later ones
/// override earlier keys). Pasta is the agents' network when the last setting of
/// `network.default_rootless_network_cmd` is "pasta" or unset (podman 5's default), or
/// `containers.netns` or `engine.network_cmd_path` names pasta. Returns the refusal — the
/// file, the option and why — if pasta is used and any file's `network.pasta_options`
/// forwards; nullopt if the configuration is safe. Throws RunnerError if a file does not parse.
std::optional<std::string> pastaForwardRefusal(const std::vector<ConfFile>& files);

/// The containers.conf files podman may read, in its order: /usr/share/containers/
/// containers.conf, /etc/containers/containers.conf, /etc/containers/containers.conf.d/*.conf
/// (sorted), the operator's $CONTAINERS_CONF (`operator_conf`, may be null) and `ours`. Missing
/// files are left out.
std::vector<std::string> containersConfCandidates(const char* operator_conf,
                                                  const std::string& ours);

/// Reads every candidate and throws RunnerError with pastaForwardRefusal()'s message if it
/// refuses (or if a file cannot be read or parsed).
void verifyNoPastaForwards(const std::vector<std::string>& paths);

}  // namespace runner::podman
