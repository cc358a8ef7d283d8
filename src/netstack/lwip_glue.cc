#include "netstack/lwip_glue.h"

#include "netstack/log.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

extern "C" {
#include "lwip/init.h"
#include "lwip/ip.h"
#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "lwip/priv/tcp_priv.h"
#include "lwip/tcp.h"
#include "lwip/timeouts.h"
}

// lwipopts.h turns lwIP's TCP sanity checks off for the sake of one that only a 16-bit snd_buf
// needs; these are the rest of them (lwIP's init.c), and the reason that one does not apply.
static_assert(sizeof(tcpwnd_size_t) == 4, "TCP_MSS above 16383 needs LWIP_WND_SCALE");
static_assert(TCP_SND_BUF >= 2 * TCP_MSS, "TCP_SND_BUF must hold two segments");
static_assert(TCP_SND_QUEUELEN >= 2 * (TCP_SND_BUF / TCP_MSS), "TCP_SND_QUEUELEN too small");
static_assert(TCP_SNDLOWAT < TCP_SND_BUF, "TCP_SNDLOWAT must be below TCP_SND_BUF");
static_assert(TCP_SNDQUEUELOWAT < TCP_SND_QUEUELEN, "TCP_SNDQUEUELOWAT too large");
static_assert(TCP_WND >= TCP_MSS, "TCP_WND must hold a segment");
// A segment with its TCP header (and options) and an IPv6 header fits a pbuf's u16 length.
static_assert(TCP_MSS + 20 + 40 + 40 <= 0xffff, "TCP_MSS too large for a pbuf");

namespace netstack {
namespace {

// lwIP's state is global: at most one live LwipGlue, and lwip_init() runs once per process.
bool g_lwip_initialized = false;
LwipGlue* g_instance = nullptr;

// lwIP's timer granularity: its TCP timers tick every 250 ms; never sleep longer than that
// while any timeout is pending, never spin faster than 1 ms.
constexpr uint32_t kMaxTimerSleepMs = 250;
constexpr int kMaxIovecs = 64;
constexpr const char* kNetifAddress4 = "100.127.255.253";

}  // namespace

LwipGlue::LwipGlue(asio::io_context& io, int tun_fd, Counters& counters)
    : io_(io), tun_fd_(tun_fd), counters_(counters), timer_(io) {}

LwipGlue::~LwipGlue() { stop(); }

void LwipGlue::start(uint16_t mtu, AcceptFn accept, void* accept_arg) {
  if (g_instance != nullptr) throw std::runtime_error("lwIP: a network stack already runs");
  if (!g_lwip_initialized) {
    lwip_init();
    g_lwip_initialized = true;
  }
  g_instance = this;
  accept_ = accept;
  accept_arg_ = accept_arg;
  netif_ = new netif{};
  if (netif_add_noaddr(
          netif_, this, [](netif* n) -> err_t { return netifInit(n); }, nullptr) == nullptr) {
    throw std::runtime_error("lwIP: netif_add failed");
  }
  // lwIP routes IPv4 output only through a netif with an IPv4 address. Which one does not
  // matter (every pcb has its own local address, the destination the agent dialled); the
  // resolver's address is one that nothing else uses.
  ip4_addr_t addr;
  ip4_addr_t mask;
  ip4_addr_t gw;
  ip4addr_aton(kNetifAddress4, &addr);
  IP4_ADDR(&mask, 255, 255, 255, 255);
  ip4_addr_set_zero(&gw);
  netif_set_addr(netif_, &addr, &mask, &gw);
  netif_->mtu = mtu;
#if LWIP_IPV6 && LWIP_ND6_ALLOW_RA_UPDATES
  netif_->mtu6 = mtu;
#endif
  netif_set_default(netif_);
  netif_set_link_up(netif_);
  netif_set_up(netif_);
  started_ = true;
  kickTimers();
}

void LwipGlue::stop() {
  if (!started_) return;
  started_ = false;
  timer_.cancel();
  for (auto& [port, listener] : listeners_) {
    if (listener.pcb != nullptr) tcp_close(listener.pcb);
  }
  listeners_.clear();
  // Established pcbs are dropped with the process (PID 1 exits); lwIP has no global teardown.
  netif_set_down(netif_);
  netif_remove(netif_);
  delete netif_;
  netif_ = nullptr;
  g_instance = nullptr;
}

err_t LwipGlue::netifInit(netif* nif) {
  nif->name[0] = 't';
  nif->name[1] = 'u';
  nif->output = [](netif* n, pbuf* p, const ip4_addr_t* a) -> err_t { return output4(n, p, a); };
  nif->output_ip6 = [](netif* n, pbuf* p, const ip6_addr_t* a) -> err_t {
    return output6(n, p, a);
  };
  nif->flags = 0;  // point-to-point: no broadcast, no ARP, no ethernet
  return ERR_OK;
}

int8_t LwipGlue::output4(netif* nif, pbuf* p, const void* /*addr*/) {
  return static_cast<LwipGlue*>(nif->state)->writePbuf(p);
}

int8_t LwipGlue::output6(netif* nif, pbuf* p, const void* /*addr*/) {
  return static_cast<LwipGlue*>(nif->state)->writePbuf(p);
}

int8_t LwipGlue::writePbuf(pbuf* p) {
  iovec iov[kMaxIovecs];
  int n = 0;
  for (pbuf* q = p; q != nullptr && n < kMaxIovecs; q = q->next) {
    iov[n].iov_base = q->payload;
    iov[n].iov_len = q->len;
    ++n;
  }
  const ssize_t written = ::writev(tun_fd_, iov, n);
  if (written != static_cast<ssize_t>(p->tot_len)) ++counters_.tun_write_errors;
  return ERR_OK;  // a lost packet is the link's business; TCP retransmits
}

void LwipGlue::writeTun(std::span<const uint8_t> packet) {
  const ssize_t written = ::write(tun_fd_, packet.data(), packet.size());
  if (written != static_cast<ssize_t>(packet.size())) ++counters_.tun_write_errors;
}

void LwipGlue::input(std::span<const uint8_t> bytes, const Packet& packet) {
  pbuf* p = pbuf_alloc(PBUF_RAW, static_cast<u16_t>(packet.total_len), PBUF_RAM);
  if (p == nullptr) return;  // out of memory: dropped like a congested link would
  std::memcpy(p->payload, bytes.data(), packet.total_len);
  // What ip4_input()/ip6_input() would set before handing the segment to tcp_input().
  ip_data.current_netif = netif_;
  ip_data.current_input_netif = netif_;
  ip_data.current_ip_header_tot_len = static_cast<u16_t>(packet.ip_header_len);
  if (packet.version == 4) {
    auto* hdr = static_cast<ip_hdr*>(p->payload);
    ip_data.current_ip4_header = hdr;
    ip_data.current_ip6_header = nullptr;
    ip_addr_copy_from_ip4(ip_data.current_iphdr_src, hdr->src);
    ip_addr_copy_from_ip4(ip_data.current_iphdr_dest, hdr->dest);
  } else {
    auto* hdr = static_cast<ip6_hdr*>(p->payload);
    ip_data.current_ip4_header = nullptr;
    ip_data.current_ip6_header = hdr;
    ip_addr_copy_from_ip6_packed(ip_data.current_iphdr_src, hdr->src);
    ip_addr_copy_from_ip6_packed(ip_data.current_iphdr_dest, hdr->dest);
  }
  pbuf_remove_header(p, packet.ip_header_len);
  tcp_input(p, netif_);
  ip_data.current_netif = nullptr;
  ip_data.current_input_netif = nullptr;
  ip_data.current_ip4_header = nullptr;
  ip_data.current_ip6_header = nullptr;
  ip_data.current_ip_header_tot_len = 0;
  ip_addr_set_zero(&ip_data.current_iphdr_src);
  ip_addr_set_zero(&ip_data.current_iphdr_dest);
  kickTimers();
}

bool LwipGlue::acquireListener(uint16_t port) {
  Listener& listener = listeners_[port];
  if (listener.pcb == nullptr) {
    tcp_pcb* pcb = tcp_new_ip_type(IPADDR_TYPE_ANY);
    if (pcb == nullptr) {
      listeners_.erase(port);
      return false;
    }
    ip_set_option(pcb, SOF_REUSEADDR);  // inherited by every pcb it accepts
    if (tcp_bind(pcb, IP_ANY_TYPE, port) != ERR_OK) {
      tcp_close(pcb);
      listeners_.erase(port);
      return false;
    }
    tcp_pcb* listening = tcp_listen(pcb);  // frees `pcb` and returns a smaller listen pcb
    if (listening == nullptr) {
      tcp_close(pcb);
      listeners_.erase(port);
      return false;
    }
    tcp_arg(listening, accept_arg_);
    tcp_accept(listening, reinterpret_cast<tcp_accept_fn>(accept_));
    listener.pcb = listening;
  }
  ++listener.refs;
  return true;
}

void LwipGlue::releaseListener(uint16_t port) {
  auto it = listeners_.find(port);
  if (it == listeners_.end()) return;
  if (--it->second.refs == 0) {
    tcp_close(it->second.pcb);
    listeners_.erase(it);
  }
}

void LwipGlue::kickTimers() {
  if (!started_) return;
  sys_check_timeouts();
  armTimer();
}

void LwipGlue::armTimer() {
  const u32_t sleep = sys_timeouts_sleeptime();
  if (sleep == SYS_TIMEOUTS_SLEEPTIME_INFINITE) return;
  const auto expiry =
      asio::steady_timer::clock_type::now() +
      std::chrono::milliseconds(std::max<u32_t>(1, std::min(sleep, kMaxTimerSleepMs)));
  if (timer_armed_ && timer_expiry_ <= expiry) return;
  timer_armed_ = true;
  timer_expiry_ = expiry;
  timer_.expires_at(expiry);
  timer_.async_wait([this](const asio::error_code& ec) {
    if (ec) return;  // re-armed earlier, or stopped
    timer_armed_ = false;
    kickTimers();
  });
}

}  // namespace netstack
