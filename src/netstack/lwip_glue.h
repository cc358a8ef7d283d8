#pragma once
// lwIP as netstack uses it: one tun netif whose output goes straight to tun0, TCP segments
// fed to tcp_input() directly, and one listening pcb per destination port while a flow to
// that port waits for its handshake. lwIP keeps global state, so there is one LwipGlue per
// process; everything runs on the stack's single thread.

#include "netstack/limits.h"
#include "netstack/packet.h"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <cstdint>
#include <span>
#include <unordered_map>

struct tcp_pcb;
struct netif;
struct pbuf;

namespace netstack {

class LwipGlue {
 public:
  /// Called for each connection lwIP completes (the agent's final ACK arrived).
  using AcceptFn = int8_t (*)(void* arg, tcp_pcb* pcb, int8_t err);

  LwipGlue(asio::io_context& io, int tun_fd, Counters& counters);
  ~LwipGlue();
  LwipGlue(const LwipGlue&) = delete;
  LwipGlue& operator=(const LwipGlue&) = delete;

  /// Initializes lwIP (once per process) and brings the netif up with `mtu`.
  void start(uint16_t mtu, AcceptFn accept, void* accept_arg);
  void stop();

  /// Feeds one parsed TCP packet into lwIP, bypassing ip_input's "is this my address" check,
  /// so lwIP terminates connections to any destination.
  void input(std::span<const uint8_t> bytes, const Packet& packet);

  /// Makes sure a pcb listens on `port` (any address, both families); counted per caller.
  bool acquireListener(uint16_t port);
  void releaseListener(uint16_t port);

  /// Runs lwIP's timers now if due, and re-arms the asio timer for the next one.
  void kickTimers();

  /// Writes one whole IP packet to tun0 (a short or failed write loses the packet, as a link
  /// would; TCP retransmits).
  void writeTun(std::span<const uint8_t> packet);

 private:
  static int8_t netifInit(netif* nif);
  static int8_t output4(netif* nif, pbuf* p, const void* addr);
  static int8_t output6(netif* nif, pbuf* p, const void* addr);
  int8_t writePbuf(pbuf* p);
  void armTimer();

  asio::io_context& io_;
  int tun_fd_;
  Counters& counters_;
  netif* netif_ = nullptr;
  asio::steady_timer timer_;
  bool timer_armed_ = false;
  asio::steady_timer::time_point timer_expiry_{};
  struct Listener {
    tcp_pcb* pcb = nullptr;
    size_t refs = 0;
  };
  std::unordered_map<uint16_t, Listener> listeners_;
  AcceptFn accept_ = nullptr;
  void* accept_arg_ = nullptr;
  bool started_ = false;
};

}  // namespace netstack
