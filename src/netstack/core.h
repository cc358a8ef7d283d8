#pragma once
// What every flow of the stack shares: the loop, the boundary's address, the virtual DNS,
// lwIP, the flow tables and the counters. Internal to netstack.

#include "netstack/boundary.h"
#include "netstack/limits.h"
#include "netstack/lwip_glue.h"
#include "netstack/packet.h"

#include <asio/io_context.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace vdns {
class VirtualDns;
}

namespace netstack {

class TcpFlow;
class UdpFlow;

struct Core {
  Core(asio::io_context& io_context, int tun_fd) : io(io_context), lwip(io, tun_fd, counters) {}

  asio::io_context& io;
  BoundaryAddress boundary;
  vdns::VirtualDns* dns = nullptr;
  Counters counters;
  LwipGlue lwip;
  std::unordered_map<FlowKey, std::shared_ptr<TcpFlow>, FlowKeyHash> tcp_flows;
  std::unordered_map<FlowKey, std::shared_ptr<UdpFlow>, FlowKeyHash> udp_flows;
  size_t pending_syns = 0;
  bool stopping = false;
  /// True while the stack handles one batch of packets read from tun0. Flows that receive
  /// data meanwhile write it to the boundary once, when the batch ends (flushAfterBatch),
  /// instead of once per segment: a sendmsg() per 1460-byte segment was a third of
  /// nano-init's CPU on an upload (bench/nano_init_bench.py).
  bool in_batch = false;
  std::vector<std::shared_ptr<TcpFlow>> flush_after_batch;
  /// One read buffer for every boundary socket: reads happen one at a time on this thread
  /// and their bytes are handed to lwIP (copied) or written to tun0 at once, so no flow
  /// needs a buffer of its own while it waits.
  std::array<char, kMaxReadChunk> scratch{};

  /// The name the agent resolved for `addr`, if it is a live synthetic address.
  [[nodiscard]] std::optional<std::string> nameFor(const Endpoint& dst) const;
  [[nodiscard]] bool isResolver(const Endpoint& dst) const;
  /// Answers one DNS query (the virtual DNS), or "" to drop it.
  std::string answerDns(std::string_view query);
  void flowOpened(const Endpoint& dst);
  void flowClosed(const Endpoint& dst);
};

}  // namespace netstack
