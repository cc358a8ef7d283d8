// The stack's packet loop: every IP packet from tun0 is parsed here first. TCP SYNs are held
// (a TcpFlow asks the boundary before lwIP may answer), other TCP segments go to lwIP, UDP
// never touches lwIP (one UdpFlow per source/destination pair), and DNS to the virtual
// resolver is answered locally.

#include "netstack/stack.h"

#include "netstack/core.h"
#include "netstack/h2_mux.h"
#include "netstack/ingress.h"
#include "netstack/log.h"
#include "netstack/tcp_flow.h"
#include "netstack/udp_flow.h"
#include "vdns/virtual_dns.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

extern "C" {
#include "lwip/tcp.h"
}

namespace netstack {
namespace {

constexpr uint16_t kDnsPort = 53;
constexpr uint16_t kDefaultMtu = 1500;

Endpoint endpointOf(const ip_addr_t& addr, uint16_t port) {
  Endpoint e;
  e.port = port;
  if (IP_IS_V6_VAL(addr)) {
    e.v6 = true;
    std::memcpy(e.addr.data(), ip_2_ip6(&addr)->addr, 16);
  } else {
    std::memcpy(e.addr.data(), &ip_2_ip4(&addr)->addr, 4);
  }
  return e;
}

// tun0's MTU, so lwIP's segments fill but never exceed what the agent's kernel accepts.
uint16_t tunMtu(int fd) {
  ifreq ifr{};
  if (::ioctl(fd, TUNGETIFF, &ifr) != 0) return kDefaultMtu;
  const int sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return kDefaultMtu;
  const int rc = ::ioctl(sock, SIOCGIFMTU, &ifr);
  ::close(sock);
  if (rc != 0 || ifr.ifr_mtu < 1280 || ifr.ifr_mtu > 65535) return kDefaultMtu;
  return static_cast<uint16_t>(ifr.ifr_mtu);
}

}  // namespace

std::optional<std::string> Core::nameFor(const Endpoint& dst) const {
  if (dns == nullptr) return std::nullopt;
  return dns->nameFor(dst.address());
}

bool Core::isResolver(const Endpoint& dst) const {
  static const Endpoint resolver =
      Endpoint::from(asio::ip::make_address(vdns::kResolverAddress), kDnsPort);
  return dst == resolver;
}

std::string Core::answerDns(std::string_view query) {
  if (dns == nullptr) return {};
  ++counters.dns_queries;
  return dns->answer(query);
}

void Core::flowOpened(const Endpoint& dst) {
  if (dns != nullptr) dns->flowOpened(dst.address());
}

void Core::flowClosed(const Endpoint& dst) {
  if (dns != nullptr) dns->flowClosed(dst.address());
}

struct Stack::Impl {
  Impl(asio::io_context& io, Options opts)
      : options(std::move(opts)), core(io, options.tun_fd), tun(io), sweep_timer(io) {}

  void start();
  void stop();
  void readTun();
  void flushBatch();
  void onPacket(std::span<const uint8_t> bytes);
  void onTcp(std::span<const uint8_t> bytes, const Packet& packet);
  void onUdp(const Packet& packet);
  void sweep();
  static int8_t onAccept(void* arg, tcp_pcb* pcb, int8_t err);
  void refuseSyn(const Packet& syn);

  Options options;
  Core core;
  asio::posix::stream_descriptor tun;
  asio::steady_timer sweep_timer;
  std::unique_ptr<Ingress> ingress;
  std::vector<uint8_t> packet_buf = std::vector<uint8_t>(kMaxPacketBytes);
  bool started = false;
};

void Stack::Impl::start() {
  if (options.tun_fd < 0) throw std::runtime_error("netstack: no tun fd");
  std::string error;
  auto boundary = parseBoundary(options.boundary, &error);
  if (!boundary) throw std::runtime_error("netstack: " + error);
  core.boundary = *boundary;
  if (core.boundary.isH2()) {
    // One byte stream for every flow (h2_mux.h); opened now, so a bad path stops start-up.
    core.boundary.mux = std::make_shared<H2Mux>(core.io, core.boundary);
    core.boundary.mux->start();
  }
  core.dns = options.dns;
  const int flags = ::fcntl(options.tun_fd, F_GETFL);
  if (flags < 0 || ::fcntl(options.tun_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("netstack: fcntl(tun, O_NONBLOCK): ") +
                             std::strerror(errno));
  }
  const uint16_t mtu = tunMtu(options.tun_fd);
  tun.assign(options.tun_fd);
  core.lwip.start(mtu, &Impl::onAccept, &core);
  if (!options.ingress_socket.empty()) {
    ingress = std::make_unique<Ingress>(core.io, options.ingress_socket, core.counters);
    ingress->start();
  }
  started = true;
  log::info("netstack started", {{"boundary", options.boundary}, {"mtu", mtu}});
  readTun();
  sweep();
}

void Stack::Impl::stop() {
  if (!started) return;
  started = false;
  core.stopping = true;
  asio::error_code ignored;
  sweep_timer.cancel();
  if (ingress) ingress->stop();
  std::vector<std::shared_ptr<TcpFlow>> tcp;
  for (auto& [key, flow] : core.tcp_flows) tcp.push_back(flow);
  for (auto& flow : tcp) flow->drop();
  std::vector<std::shared_ptr<UdpFlow>> udp;
  for (auto& [key, flow] : core.udp_flows) udp.push_back(flow);
  for (auto& flow : udp) flow->close();
  core.tcp_flows.clear();
  core.udp_flows.clear();
  core.flush_after_batch.clear();
  core.lwip.stop();
  tun.close(ignored);
  if (const auto& mux = core.boundary.mux) {
    mux->stop();
    log::info("h2 boundary stopped", {{"streams_opened", mux->streamsOpened()},
                                      {"streams_unopened", mux->streamsUnopened()},
                                      {"upstream_failures", mux->upstreamFailures()}});
  }
  const Counters& c = core.counters;
  log::info("netstack stopped", {{"tcp_accepted", c.tcp_accepted},
                                 {"tcp_refused", c.tcp_refused},
                                 {"udp_accepted", c.udp_accepted},
                                 {"udp_refused", c.udp_refused},
                                 {"udp_unreachable", c.udp_unreachable},
                                 {"dns_queries", c.dns_queries},
                                 {"cap_tcp_flows", c.tcp_flows_cap},
                                 {"cap_pending_syns", c.pending_syns_cap},
                                 {"cap_dns_tcp_flows", c.dns_tcp_flows_cap},
                                 {"cap_udp_flows", c.udp_flows_cap},
                                 {"cap_udp_queue", c.udp_queue_cap},
                                 {"syn_retransmits_dropped", c.syn_retransmits_dropped},
                                 {"malformed_packets", c.malformed_packets},
                                 {"unsupported_packets", c.unsupported_packets},
                                 {"tcp_idle_timeouts", c.tcp_idle_timeouts},
                                 {"handshake_timeouts", c.handshake_timeouts},
                                 {"tun_write_errors", c.tun_write_errors},
                                 {"ingress_refused", c.ingress_refused}});
}

void Stack::Impl::readTun() {
  tun.async_wait(asio::posix::descriptor_base::wait_read, [this](const asio::error_code& ec) {
    if (ec || !started) return;
    bool tun_failed = false;
    core.in_batch = true;
    for (int i = 0; i < kMaxPacketsPerWakeup && started; ++i) {
      const ssize_t n = ::read(tun.native_handle(), packet_buf.data(), packet_buf.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        log::error("netstack: read(tun0) failed", {{"error", std::strerror(errno)}});
        tun_failed = true;  // tun0 is gone: the sandbox has no network any more
        break;
      }
      if (n == 0) break;
      onPacket({packet_buf.data(), static_cast<size_t>(n)});
    }
    core.in_batch = false;
    flushBatch();
    if (started && !tun_failed) readTun();
  });
}

void Stack::Impl::flushBatch() {
  std::vector<std::shared_ptr<TcpFlow>> flows;
  flows.swap(core.flush_after_batch);
  for (auto& flow : flows) flow->flushAfterBatch();
}

void Stack::Impl::onPacket(std::span<const uint8_t> bytes) {
  Packet packet;
  switch (parsePacket(bytes, &packet)) {
    case ParseStatus::kMalformed:
      ++core.counters.malformed_packets;
      return;
    case ParseStatus::kUnsupported:
      ++core.counters.unsupported_packets;
      return;
    case ParseStatus::kOk:
      break;
  }
  if (packet.protocol == kProtoTcp) {
    onTcp(bytes, packet);
  } else {
    onUdp(packet);
  }
}

void Stack::Impl::refuseSyn(const Packet& syn) {
  const std::string rst = buildTcpRst(syn);
  core.lwip.writeTun({reinterpret_cast<const uint8_t*>(rst.data()), rst.size()});
}

void Stack::Impl::onTcp(std::span<const uint8_t> bytes, const Packet& packet) {
  auto it = core.tcp_flows.find(packet.key);
  if (it != core.tcp_flows.end()) {
    std::shared_ptr<TcpFlow> flow = it->second;
    if (packet.isSyn()) {
      flow->onSyn(bytes, packet);
      return;
    }
    const TcpFlow::State state = flow->state();
    if (state == TcpFlow::State::kOpening) {
      if (packet.tcp_flags & kTcpRst) flow->cancel();
      return;  // nothing else is valid before our SYN-ACK
    }
    core.lwip.input(bytes, packet);
    // A reset during the handshake frees lwIP's pcb without a callback: forget the flow.
    if ((packet.tcp_flags & kTcpRst) && state == TcpFlow::State::kHandshaking) flow->cancel();
    return;
  }
  if (!packet.isSyn()) {
    core.lwip.input(bytes, packet);  // lwIP's own (closing pcbs), or it answers with RST
    return;
  }
  const bool dns = core.isResolver(packet.key.dst);
  if (core.tcp_flows.size() >= kMaxTcpFlows) {
    ++core.counters.tcp_flows_cap;
    refuseSyn(packet);
    return;
  }
  if (dns && std::count_if(core.tcp_flows.begin(), core.tcp_flows.end(), [](const auto& f) {
               return f.second->localDns();
             }) >= static_cast<std::ptrdiff_t>(kMaxDnsTcpFlows)) {
    ++core.counters.dns_tcp_flows_cap;
    refuseSyn(packet);
    return;
  }
  if (!dns && core.pending_syns >= kMaxPendingSyns) {
    ++core.counters.pending_syns_cap;
    refuseSyn(packet);
    return;
  }
  std::string syn(reinterpret_cast<const char*>(bytes.data()), packet.total_len);
  auto flow = std::make_shared<TcpFlow>(core, packet.key, std::move(syn), dns);
  core.tcp_flows.emplace(packet.key, flow);
  flow->start();
}

void Stack::Impl::onUdp(const Packet& packet) {
  if (core.isResolver(packet.key.dst)) {
    const std::string answer = core.answerDns(packet.payload);
    if (answer.empty()) return;
    const std::string reply = buildUdp(packet.key.dst, packet.key.src, answer);
    if (!reply.empty()) {
      core.lwip.writeTun({reinterpret_cast<const uint8_t*>(reply.data()), reply.size()});
    }
    return;
  }
  auto it = core.udp_flows.find(packet.key);
  if (it == core.udp_flows.end()) {
    if (core.udp_flows.size() >= kMaxUdpFlows) {
      ++core.counters.udp_flows_cap;
      return;
    }
    auto flow = std::make_shared<UdpFlow>(core, packet.key);
    it = core.udp_flows.emplace(packet.key, flow).first;
    flow->start();
  }
  std::shared_ptr<UdpFlow> flow = it->second;
  flow->send(packet.payload);
}

int8_t Stack::Impl::onAccept(void* arg, tcp_pcb* pcb, int8_t err) {
  auto* core = static_cast<Core*>(arg);
  if (err != ERR_OK || pcb == nullptr) return ERR_VAL;
  const FlowKey key{endpointOf(pcb->remote_ip, pcb->remote_port),
                    endpointOf(pcb->local_ip, pcb->local_port)};
  auto it = core->tcp_flows.find(key);
  if (it == core->tcp_flows.end() || it->second->state() != TcpFlow::State::kHandshaking) {
    tcp_abort(pcb);  // no flow waits for this handshake (timed out meanwhile)
    return ERR_ABRT;
  }
  it->second->attach(pcb);
  return ERR_OK;
}

void Stack::Impl::sweep() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<TcpFlow>> tcp;
  tcp.reserve(core.tcp_flows.size());
  for (auto& [key, flow] : core.tcp_flows) tcp.push_back(flow);
  for (auto& flow : tcp) flow->sweep(now);
  std::vector<std::shared_ptr<UdpFlow>> udp;
  udp.reserve(core.udp_flows.size());
  for (auto& [key, flow] : core.udp_flows) udp.push_back(flow);
  for (auto& flow : udp) flow->sweep(now);
  sweep_timer.expires_after(kSweepInterval);
  sweep_timer.async_wait([this](const asio::error_code& ec) {
    if (!ec && started) sweep();
  });
}

Stack::Stack(asio::io_context& io, Options options)
    : impl_(std::make_unique<Impl>(io, std::move(options))) {}

Stack::~Stack() { stop(); }

void Stack::start() { impl_->start(); }

void Stack::stop() {
  if (impl_) impl_->stop();
}

}  // namespace netstack
