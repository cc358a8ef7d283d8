#pragma once
// Every cap of the boundary, named beside its owner. Each one, when hit, is counted in
// sam_box_limit_hits_total{limit="<label>"} and logged.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace sambox {

/// Most tunnels (TCP, UDP and mesh) open at once; the next is answered 503 too-many-flows.
inline constexpr size_t kMaxConcurrentFlows = 4096;
/// Time allowed for the whole request head to arrive; then 408 header-timeout.
inline constexpr std::chrono::milliseconds kHeadReadTimeout{10'000};
/// Time allowed to resolve and connect upstream; then 504 connect-timeout.
inline constexpr std::chrono::milliseconds kConnectTimeout{10'000};
/// Name lookups that may run at once (each holds one thread while getaddrinfo(3) blocks).
/// Threads start as lookups need them.
inline constexpr size_t kResolverThreads = 8;
/// How long a name's answer is reused by later flows (each still judged address by address);
/// the default of --resolve-cache-ttl, which may set 0 (off) up to kMaxResolveCacheTtl.
inline constexpr std::chrono::milliseconds kResolveCacheTtl{5'000};
inline constexpr std::chrono::milliseconds kMaxResolveCacheTtl{3'600'000};
/// Most names whose answers are kept (a wildcard rule allows unboundedly many names).
inline constexpr size_t kResolveCacheEntries = 1024;
/// A TCP flow with no byte either way for this long is closed.
inline constexpr std::chrono::milliseconds kTcpIdleTimeout{30 * 60 * 1000};
/// Once one side of a TCP flow (mesh included) has ended, the flow may stay silent this long;
/// then it is closed and counted as half-closed-timeout.
inline constexpr std::chrono::milliseconds kHalfClosedTimeout{120'000};
/// How often an idle flow's counters are looked at (upper bound on timeout overshoot).
inline constexpr std::chrono::milliseconds kIdleCheckInterval{5'000};
/// The TCP relay's watchdog (relay.h) as one value: the defaults are the limits above, and
/// nothing but a test shortens them (Config::tcp_timeouts; no flag sets them).
struct TcpTimeouts {
  std::chrono::milliseconds idle = kTcpIdleTimeout;               ///< tcp-idle-timeout
  std::chrono::milliseconds half_closed = kHalfClosedTimeout;     ///< half-closed-timeout
  std::chrono::milliseconds check_interval = kIdleCheckInterval;  ///< overshoot bound
};
/// A connect-udp flow with no datagram either way for this long is closed.
inline constexpr std::chrono::milliseconds kUdpIdleTimeout{60'000};
/// Once sam-box is told to stop, the most it waits for the flows it ended to log their line
/// (they need a few turns of the loop) and for tunnels still being set up (a name lookup
/// cannot be interrupted) before it exits anyway.
inline constexpr std::chrono::milliseconds kStopGrace{2'000};
/// Pause after a failed accept(2) (e.g. EMFILE) before accepting again.
inline constexpr std::chrono::milliseconds kAcceptBackoff{50};
/// File descriptors a flow may hold: two sockets and two pipes (one per relay direction,
/// held only while bytes are in flight).
inline constexpr size_t kFdsPerFlow = 6;
/// Size of the relay pipes, and bytes moved per splice(2) call. Larger steps mean fewer
/// calls and wake-ups per byte than the default 64 KiB; 1 MiB measured no better than this
/// (docs/sam-box.md) and pins four times the memory per direction in flight. A pipe is held
/// only while its bytes are in flight.
inline constexpr size_t kRelayPipeBytes = size_t{256} * 1024;
/// SO_SNDBUF asked for on the agent's side of an external TCP flow (the kernel doubles it,
/// after capping it at net.core.wmem_max). Measured: halves sam-box's CPU per GiB sent to
/// the agent. Memory only while bytes wait for the agent to read them.
inline constexpr int kAgentSendBufferBytes = 1024 * 1024;
/// Empty relay pipes kept for reuse by later flows. Few: for a non-root sam-box the kernel
/// counts each pipe's full size against fs.pipe-user-pages-soft (64 MiB) whether it is used
/// or not.
inline constexpr size_t kRelayIdlePipes = 8;
/// Read buffer of the userspace copies (mesh requests, capsules, request heads).
inline constexpr size_t kReadBufferBytes = size_t{16} * 1024;
/// HTTP/2 (h2_session.h): the receive window of each stream, in bytes. An agent stream's
/// bytes are credited back only once its upstream socket took them, so this is the most
/// sam-box buffers per stream towards the upstream.
inline constexpr int32_t kH2StreamWindowBytes = 256 * 1024;
/// HTTP/2: the connection's receive window, in bytes: the most in flight from the agent at
/// once. It is credited back as DATA arrives (the stream's window, as its upstream takes it),
/// so streams whose upstreams do not read never hold back the others; what sam-box buffers is
/// bounded per stream by kH2StreamWindowBytes.
inline constexpr int32_t kH2ConnectionWindowBytes = 16 * 1024 * 1024;
/// HTTP/2: bytes from an upstream waiting to be framed for the agent, per stream; past it
/// sam-box stops reading that upstream until the agent's flow-control window lets them go.
inline constexpr size_t kH2StreamBufferBytes = size_t{256} * 1024;
/// HTTP/2: most streams alive at once over all of the agent's connections, refused ones
/// included (a refusal holds its stream until its response is written, which an agent that
/// does not read can delay forever). Past it every connection stops reading its agent until
/// streams close; nghttp2 is fed at most kH2RecvChunkBytes between checks, so the overshoot
/// is a few hundred streams.
inline constexpr size_t kMaxH2Streams = 2 * kMaxConcurrentFlows;
inline constexpr size_t kH2RecvChunkBytes = size_t{4} * 1024;
/// Most ingress connections served at once (each holds two sockets); the next is answered 503
/// too-many-flows at once.
inline constexpr size_t kMaxIngressConnections = 1024;
/// Longest credential token file read, in bytes.
inline constexpr size_t kMaxTokenFileBytes = size_t{16} * 1024;

// Label values of sam_box_limit_hits_total.
inline constexpr const char* kLimitMaxHeaderBytes = "max-header-bytes";
inline constexpr const char* kLimitMaxConcurrentFlows = "max-concurrent-flows";
inline constexpr const char* kLimitMaxIngressConnections = "max-ingress-connections";
inline constexpr const char* kLimitConnectTimeout = "connect-timeout";
inline constexpr const char* kLimitHeadReadTimeout = "head-read-timeout";
inline constexpr const char* kLimitUdpIdleTimeout = "udp-idle-timeout";
inline constexpr const char* kLimitTcpIdleTimeout = "tcp-idle-timeout";
inline constexpr const char* kLimitHalfClosedTimeout = "half-closed-timeout";

}  // namespace sambox
