#pragma once
// Every cap of the network stack, named beside its counter (STYLE.md "Every cap named beside
// its owner"). A hit cap never crashes or blocks: the flow or datagram is refused, counted,
// and the counters are logged when the stack stops.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace netstack {

/// Most TCP flows at once (established, handshaking or waiting for the boundary).
inline constexpr size_t kMaxTcpFlows = 4096;
/// Most TCP SYNs waiting for the boundary's verdict at once; further SYNs get a RST.
inline constexpr size_t kMaxPendingSyns = 256;
/// Most UDP flows (one per source/destination pair) at once.
inline constexpr size_t kMaxUdpFlows = 1024;
/// Most datagrams queued per UDP flow while its tunnel opens or its socket is full.
inline constexpr size_t kMaxUdpQueuedDatagrams = 64;
/// Most bytes queued per UDP flow (same situation).
inline constexpr size_t kMaxUdpQueuedBytes = size_t{256} * 1024;
/// Largest boundary response head (status line + headers) read.
inline constexpr size_t kMaxResponseHeadBytes = size_t{8} * 1024;
/// Most bytes read from a boundary socket at once for one TCP flow; the read also never
/// exceeds lwIP's free send buffer for the flow, which is the back-pressure towards the agent.
inline constexpr size_t kMaxReadChunk = size_t{64} * 1024;
/// Most packets read from tun0 per wake-up before other work runs.
inline constexpr int kMaxPacketsPerWakeup = 256;
/// Largest IP packet read from tun0.
inline constexpr size_t kMaxPacketBytes = 65535;
/// Most DNS-over-TCP connections to the virtual resolver at once (each may hold lwIP's send
/// buffer of answers the agent does not read); further SYNs to it get a RST. Resolvers use
/// TCP only after a truncated UDP answer, one connection at a time.
inline constexpr size_t kMaxDnsTcpFlows = 64;
/// Most TCP DNS queries buffered on one connection: lwIP's receive window (TCP_WND), since
/// queries are acknowledged to the agent's window only once answered; more means a peer that
/// ignores the window, and the connection is reset.
inline constexpr size_t kMaxDnsTcpBuffer = size_t{256} * 1024;
/// Most ingress connections at once.
inline constexpr size_t kMaxIngressConnections = 256;

/// Time the boundary has to connect and answer a tunnel request. Longer than sam-box's own
/// time to resolve and connect upstream (10 s, sambox::kConnectTimeout), so a destination
/// that does not answer is reported with sam-box's reason (504 connect-timeout) and not as a
/// boundary that did not answer (boundary-unreachable).
inline constexpr std::chrono::seconds kTunnelOpenTimeout{15};
/// Time the agent has to complete a handshake once its SYN was answered.
inline constexpr std::chrono::seconds kHandshakeTimeout{30};
/// A TCP flow with no byte either way for this long is reset both ways.
inline constexpr std::chrono::minutes kTcpIdleTimeout{30};
/// A UDP flow with no datagram either way for this long is closed.
inline constexpr std::chrono::seconds kUdpIdleTimeout{60};
/// A refused UDP flow is remembered this long, so a chatty client does not open one tunnel
/// per datagram.
inline constexpr std::chrono::seconds kUdpRefusalHold{10};
/// A refused UDP flow answers at most one datagram per this interval with an ICMP port
/// unreachable (as Linux's own icmp_ratelimit, 1000 ms).
inline constexpr std::chrono::seconds kUdpUnreachableInterval{1};
/// TCP keep-alive towards the agent: first probe after this much idle time.
inline constexpr std::chrono::seconds kKeepAliveIdle{60};
/// How often flows are checked for the timeouts above.
inline constexpr std::chrono::seconds kSweepInterval{5};

/// How often each cap was hit, and other events worth a line in the exit log.
struct Counters {
  uint64_t tcp_flows_cap = 0;            ///< SYN refused: kMaxTcpFlows
  uint64_t pending_syns_cap = 0;         ///< SYN refused: kMaxPendingSyns
  uint64_t dns_tcp_flows_cap = 0;        ///< SYN to the resolver refused: kMaxDnsTcpFlows
  uint64_t udp_flows_cap = 0;            ///< datagram dropped: kMaxUdpFlows
  uint64_t udp_queue_cap = 0;            ///< datagram dropped: kMaxUdpQueued*
  uint64_t tcp_refused = 0;              ///< SYN answered with RST: the boundary refused or failed
  uint64_t tcp_accepted = 0;             ///< flows whose tunnel the boundary accepted
  uint64_t udp_refused = 0;              ///< UDP tunnels the boundary refused
  uint64_t udp_unreachable = 0;          ///< ICMP port unreachable sent for refused UDP flows
  uint64_t udp_accepted = 0;             ///< UDP tunnels the boundary accepted
  uint64_t syn_retransmits_dropped = 0;  ///< SYNs seen again while the verdict was pending
  uint64_t malformed_packets = 0;        ///< packets from tun0 that failed validation
  uint64_t unsupported_packets = 0;      ///< fragments, ICMP, other protocols: dropped
  uint64_t dns_queries = 0;              ///< queries answered locally (UDP and TCP)
  uint64_t tcp_idle_timeouts = 0;        ///< flows reset by kTcpIdleTimeout
  uint64_t handshake_timeouts = 0;       ///< flows dropped by kHandshakeTimeout
  uint64_t tun_write_errors = 0;         ///< packets lost writing to tun0
  uint64_t ingress_refused = 0;          ///< ingress connections refused (target, cap, port)
};

}  // namespace netstack
