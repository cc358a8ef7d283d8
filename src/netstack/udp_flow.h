#pragma once
// One UDP flow of the agent (one source socket talking to one destination): a connect-udp
// tunnel (RFC 9298) to the boundary, datagrams carried as DATAGRAM capsules (RFC 9297) both
// ways. Datagrams sent while the tunnel opens wait in a bounded queue; past the bound they
// are dropped, as UDP may. A refused flow is remembered for a while, so a chatty client does
// not open one tunnel per datagram, and is answered as a closed port would be: an ICMP port
// unreachable (at most one per kUdpUnreachableInterval), so a connected UDP socket fails with
// ECONNREFUSED at once, as a refused TCP flow does with its RST.

#include "netstack/core.h"
#include "proto/capsule.h"

#include <asio/generic/stream_protocol.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace netstack {

class UdpFlow : public std::enable_shared_from_this<UdpFlow> {
 public:
  enum class State { kOpening, kOpen, kRefused, kClosed };
  using Clock = std::chrono::steady_clock;

  UdpFlow(Core& core, const FlowKey& key);
  ~UdpFlow();
  UdpFlow(const UdpFlow&) = delete;
  UdpFlow& operator=(const UdpFlow&) = delete;

  void start();
  /// A datagram from the agent to this flow's destination.
  void send(std::string_view payload);
  /// Applies the idle timeout and the refusal hold.
  void sweep(Clock::time_point now);
  /// Closes the tunnel and leaves the flow table (may destroy this flow).
  void close();

 private:
  void onVerdict(int status, const std::string& detail, std::string leftover);
  void flush();
  void read();
  void deliver(std::string_view bytes);
  void release();
  void sendUnreachable(std::string packet);

  Core& core_;
  FlowKey key_;
  State state_ = State::kOpening;
  std::optional<std::string> name_;
  std::string target_;
  asio::generic::stream_protocol::socket socket_;
  std::string queued_;  // capsules not yet handed to the socket
  size_t queued_datagrams_ = 0;
  std::string writing_;  // capsules the socket is writing now
  bool write_active_ = false;
  bool read_waiting_ = false;
  proto::CapsuleReader reader_;
  Clock::time_point last_activity_ = Clock::now();
  std::string unreachable_;  // the ICMP answering the first datagram, sent if refused
  Clock::time_point last_unreachable_{};
};

}  // namespace netstack
