#pragma once
// One TCP flow of the agent. Its SYN is held (lwIP never sees it) until the boundary has
// accepted the tunnel: then the SYN goes into lwIP, which answers SYN-ACK; a refusal is
// answered with a RST built here, so the agent's connect() fails at once and never sees an
// accepted-then-closed connection. Once established, bytes are relayed both ways with
// back-pressure: lwIP's receive window opens only for bytes the boundary socket took, and
// the boundary socket is read only into lwIP's free send buffer. A flow to the virtual DNS
// (TCP port 53) is answered locally instead of tunnelled.

#include "netstack/core.h"

#include <asio/generic/stream_protocol.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>

struct tcp_pcb;
struct pbuf;

namespace netstack {

class TcpFlow : public std::enable_shared_from_this<TcpFlow> {
 public:
  enum class State { kOpening, kHandshaking, kEstablished, kClosed };
  using Clock = std::chrono::steady_clock;

  /// `syn` is the agent's SYN packet, replayed into lwIP once the tunnel is accepted.
  TcpFlow(Core& core, const FlowKey& key, std::string syn, bool local_dns);
  ~TcpFlow();
  TcpFlow(const TcpFlow&) = delete;
  TcpFlow& operator=(const TcpFlow&) = delete;

  /// Whether this is a DNS-over-TCP connection to the virtual resolver (answered here).
  [[nodiscard]] bool localDns() const { return local_dns_; }
  /// Asks the boundary (or, for DNS, accepts at once).
  void start();
  /// The agent sent its SYN again: dropped while the verdict is pending, else lwIP's.
  void onSyn(std::span<const uint8_t> bytes, const Packet& packet);
  /// The agent gave up (RST) while the verdict was pending.
  void cancel();
  [[nodiscard]] State state() const { return state_; }
  /// lwIP completed the handshake of this flow's SYN.
  void attach(tcp_pcb* pcb);
  /// Applies the handshake and idle timeouts.
  void sweep(Clock::time_point now);
  /// Drops the flow (the stack stops): resets the agent's side, closes the boundary's.
  void drop() { abort("stack stopping"); }
  /// Writes what arrived during the batch of tun0 packets that just ended (Core::in_batch).
  void flushAfterBatch();

 private:
  static int8_t onRecv(void* arg, tcp_pcb* pcb, pbuf* p, int8_t err);
  static int8_t onSent(void* arg, tcp_pcb* pcb, uint16_t len);
  static void onError(void* arg, int8_t err);

  void onVerdict(int status, const std::string& detail, std::string leftover);
  void feedSyn();
  void refuse(int status, const std::string& detail);
  void receive(pbuf* p);
  void flushToBoundary();
  void waitBoundaryWritable();
  void readBoundary();
  void pumpFromBoundary();
  bool writePendingToAgent();
  void serveDns();
  /// tcp_recved(3lwip) for `bytes` taken from the agent: its window reopens by that much.
  void reopenWindow(size_t bytes);
  void maybeFinish();
  void finish();
  void abort(const char* why);
  /// Runs `fn` now, or after the current lwIP callback returns (lwIP forbids closing or
  /// aborting a pcb from inside most of its callbacks).
  template <typename Fn>
  void defer(Fn fn);
  /// Releases everything and leaves the flow table (may destroy this flow).
  void close();
  /// Releases the pcb, socket, buffers, listener and DNS reference; idempotent.
  void release();
  void detachPcb();
  void touch() { last_activity_ = Clock::now(); }

  Core& core_;
  FlowKey key_;
  std::string syn_;
  bool local_dns_;
  State state_ = State::kOpening;
  std::optional<std::string> name_;
  std::string authority_;
  asio::generic::stream_protocol::socket socket_;
  tcp_pcb* pcb_ = nullptr;
  bool counted_pending_ = false;
  bool holds_listener_ = false;
  bool in_callback_ = false;
  bool agent_eof_ = false;         // the agent sent FIN
  bool boundary_shut_wr_ = false;  // ... and the boundary socket was shut for writing
  bool boundary_eof_ = false;      // the boundary closed its side
  bool read_waiting_ = false;
  bool write_waiting_ = false;
  bool paused_ = false;            // boundary reads wait for lwIP's send buffer
  bool flush_queued_ = false;      // in Core::flush_after_batch
  std::deque<pbuf*> to_boundary_;  // received from the agent, not yet taken by the socket
  size_t front_offset_ = 0;        // bytes of to_boundary_.front() already written
  std::string to_agent_;           // bytes lwIP could not take yet (bounded, see .cc)
  std::string dns_in_;             // DNS over TCP: received, not yet answered (nor acknowledged
                                   // to the agent's window: at most TCP_WND)
  Clock::time_point started_ = Clock::now();
  Clock::time_point last_activity_ = Clock::now();
  uint64_t bytes_up_ = 0;
  uint64_t bytes_down_ = 0;
};

}  // namespace netstack
