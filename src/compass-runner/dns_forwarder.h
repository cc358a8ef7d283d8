#pragma once
// The sandbox's own resolver in egress `firewall` (issue 4): one per agent, on the host end of
// its veth, UDP and TCP port 53 on the host end's IPv4 and IPv6 addresses. It answers with
// answerQuery() (dns_answer.h): only allowed names, A and AAAA only, resolved by the host's
// getaddrinfo(3) (so /etc/hosts counts and CNAME chains are followed by the host resolver),
// each answered address added to the sandbox's allow sets before the reply leaves. Nothing
// is forwarded for a name the allowlist does not hold, so DNS is no way out.
//
// One thread runs a standalone-Asio io_context for the sockets; answers are computed on a
// small worker pool (getaddrinfo and `nft` block); each look-up has a deadline. Every cap is
// a named constant below. Each refusal is logged (JSON, common/log.h) with its reason,
// at most kMaxRefusalLogsPerSecond lines a second (then one line counting the rest).

#include <asio/ip/address.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compass-runner/dns_answer.h"
#include "policy/allowlist.h"

namespace runner::firewall {

/// Threads computing answers (each may block in getaddrinfo(3) or `nft`).
inline constexpr size_t kWorkerThreads = 4;
/// Queries accepted but not yet answered; UDP queries beyond it are dropped (clients retry).
inline constexpr int kMaxPendingQueries = 64;
/// TCP clients served at once; a connection beyond it is closed at once.
inline constexpr int kMaxTcpClients = 16;
/// Queries one TCP connection may send before it is closed (RFC 7766 allows pipelining).
inline constexpr int kMaxQueriesPerTcpConnection = 64;
/// A TCP client must send its next query within this long.
inline constexpr std::chrono::seconds kTcpIdleTimeout{10};
/// getaddrinfo(3) calls running at once in this process; more fail at once (SERVFAIL).
inline constexpr int kMaxLookups = 8;
/// How long one name's look-up may take before the query gets SERVFAIL.
inline constexpr std::chrono::milliseconds kResolveTimeout{3000};
/// Largest query accepted (a stub's query with EDNS is < 300 bytes).
inline constexpr size_t kMaxQueryBytes = 4096;
/// Refusal log lines per second, per forwarder.
inline constexpr int kMaxRefusalLogsPerSecond = 20;

/// What a forwarder serves and how it opens answered addresses.
struct ForwarderConfig {
  std::string id;                         ///< the agent's id (in every log line)
  policy::Allowlist allow;                ///< the agent's egress allowlist
  std::vector<asio::ip::address> listen;  ///< addresses to serve on (the veth's host end)
  uint16_t port = 53;
  AdmitFn admit;  ///< required: adds elements to the sandbox's sets (nft in its netns)
  LocalFn local;  ///< optional: the host's own addresses, never answered
  std::chrono::milliseconds resolve_timeout = kResolveTimeout;
};

/// Counters since start (no names: bounded by construction).
struct ForwarderStats {
  uint64_t queries = 0;   ///< queries answered or refused
  uint64_t answered = 0;  ///< replies with at least one address
  uint64_t refused = 0;   ///< queries with a refusal reason (dns_answer.h)
  uint64_t dropped = 0;   ///< UDP queries dropped at kMaxPendingQueries, TCP clients over cap
};

class DnsForwarder {
 public:
  explicit DnsForwarder(ForwarderConfig config);
  /// Stops (see stop()).
  ~DnsForwarder();
  DnsForwarder(const DnsForwarder&) = delete;
  DnsForwarder& operator=(const DnsForwarder&) = delete;

  /// Binds UDP and TCP `port` on every `listen` address and starts serving. Throws
  /// RunnerError("dns forwarder: bind [ADDR]:PORT/udp: <reason>") if any bind fails (then
  /// nothing is left listening).
  void start();
  /// Closes the sockets and joins the threads; returns within about kResolveTimeout plus the
  /// admit callback's own bound. Idempotent; never throws.
  void stop() noexcept;
  [[nodiscard]] ForwarderStats stats() const;

  /// Answers `query` (DNS wire format) on the calling thread exactly as one that arrived over
  /// UDP: the same allowlist, host resolver, admit callback, counters and refusal log; returns
  /// the reply (empty when none would be sent). For a sandbox whose resolver cannot be reached
  /// from the host (a microVM guest not yet booted) to pre-resolve its allowed names.
  std::string answerDirectly(std::string_view query);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Resolves `name` (normalized) with getaddrinfo(3) on a detached thread, without search
/// domains (RES_DNSRCH/RES_DEFNAMES cleared: the allowlist names absolute names), waiting at
/// most `timeout`. At most kMaxLookups run at once; beyond that the result is kFailed.
Resolution resolveOnHost(const std::string& name, std::chrono::milliseconds timeout);

/// Sends one UDP query for `name`/`qtype` to `server`:`port` from inside the network namespace
/// at `netns_path` (a short-lived thread setns()es there), and returns the parsed reply. This
/// is the firewall's own "resolve from inside the sandbox" (seed 000): it passes the sandbox's
/// ruleset and the forwarder exactly as an agent's query would. Throws RunnerError naming the
/// server and the failing call (setns, socket, send, timeout after `timeout`, malformed reply).
ParsedReply queryFromNetns(const std::string& netns_path, const asio::ip::address& server,
                           uint16_t port, const std::string& name, uint16_t qtype,
                           std::chrono::milliseconds timeout);

}  // namespace runner::firewall
