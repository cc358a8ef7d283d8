#include "netstack/tcp_flow.h"

#include "netstack/log.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <cerrno>
#include <optional>
#include <string>

extern "C" {
#include "lwip/tcp.h"
}

namespace netstack {
namespace {

constexpr int kMaxIovecs = 64;
/// Most bytes held for the agent beyond what lwIP took (tunnel leftovers).
constexpr size_t kMaxToAgentBytes = size_t{256} * 1024;
/// Most DNS answers held for the agent beyond what lwIP took: past it, queries wait unread
/// (and unacknowledged: the agent's window closes) until the agent reads.
constexpr size_t kMaxDnsAnswerBacklog = size_t{64} * 1024;
static_assert(kMaxDnsTcpBuffer >= TCP_WND, "a DNS connection may fill lwIP's whole window");
/// Leave a few segments of lwIP's queue free, so a write never fails halfway for lack of them.
constexpr u16_t kQueueHeadroom = 8;

}  // namespace

TcpFlow::TcpFlow(Core& core, const FlowKey& key, std::string syn, bool local_dns)
    : core_(core), key_(key), syn_(std::move(syn)), local_dns_(local_dns), socket_(core.io) {}

TcpFlow::~TcpFlow() { release(); }

void TcpFlow::start() {
  if (local_dns_) {
    feedSyn();
    return;
  }
  name_ = core_.nameFor(key_.dst);
  if (name_) core_.flowOpened(key_.dst);
  authority_ = tunnelAuthority(key_.dst, name_);
  ++core_.pending_syns;
  counted_pending_ = true;
  auto self = shared_from_this();
  asio::co_spawn(core_.io, openTunnel(socket_, core_.boundary, connectRequest(authority_)),
                 [self](std::exception_ptr error, TunnelResult result) {
                   if (error) {
                     result.status = -1;
                     result.detail = "tunnel client failed";
                   }
                   self->onVerdict(result.status, result.detail, std::move(result.leftover));
                 });
}

void TcpFlow::onVerdict(int status, const std::string& detail, std::string leftover) {
  if (counted_pending_) {
    --core_.pending_syns;
    counted_pending_ = false;
  }
  if (state_ != State::kOpening) return;  // cancelled meanwhile
  if (status != 200) {
    refuse(status, detail);
    return;
  }
  ++core_.counters.tcp_accepted;
  to_agent_ = std::move(leftover);
  log::debug("tcp flow accepted", {{"target", authority_}});
  feedSyn();
}

void TcpFlow::refuse(int status, const std::string& detail) {
  ++core_.counters.tcp_refused;
  Packet syn;
  const auto* bytes = reinterpret_cast<const uint8_t*>(syn_.data());
  if (parsePacket({bytes, syn_.size()}, &syn) == ParseStatus::kOk) {
    const std::string rst = buildTcpRst(syn);
    core_.lwip.writeTun({reinterpret_cast<const uint8_t*>(rst.data()), rst.size()});
  }
  logRefusedFlow("tcp flow refused", authority_, status, detail);
  auto self = shared_from_this();
  close();
}

void TcpFlow::feedSyn() {
  Packet syn;
  const auto* bytes = reinterpret_cast<const uint8_t*>(syn_.data());
  if (parsePacket({bytes, syn_.size()}, &syn) != ParseStatus::kOk ||
      !core_.lwip.acquireListener(key_.dst.port)) {
    abort("cannot accept in lwIP");
    return;
  }
  holds_listener_ = true;
  state_ = State::kHandshaking;
  started_ = Clock::now();
  core_.lwip.input({bytes, syn_.size()}, syn);
}

void TcpFlow::onSyn(std::span<const uint8_t> bytes, const Packet& packet) {
  if (state_ == State::kOpening) {
    ++core_.counters.syn_retransmits_dropped;
    return;
  }
  core_.lwip.input(bytes, packet);
}

void TcpFlow::cancel() {
  auto self = shared_from_this();
  close();
}

void TcpFlow::attach(tcp_pcb* pcb) {
  pcb_ = pcb;
  state_ = State::kEstablished;
  if (holds_listener_) {
    holds_listener_ = false;
    core_.lwip.releaseListener(key_.dst.port);
  }
  syn_.clear();
  syn_.shrink_to_fit();
  touch();
  tcp_arg(pcb, this);
  tcp_recv(pcb, reinterpret_cast<tcp_recv_fn>(&TcpFlow::onRecv));
  tcp_sent(pcb, reinterpret_cast<tcp_sent_fn>(&TcpFlow::onSent));
  tcp_err(pcb, reinterpret_cast<tcp_err_fn>(&TcpFlow::onError));
  tcp_nagle_disable(pcb);  // the agent's peer is far away; do not add latency here too
  ip_set_option(pcb, SOF_KEEPALIVE);
  pcb->keep_idle = static_cast<u32_t>(std::chrono::milliseconds(kKeepAliveIdle).count());
  if (local_dns_) return;
  asio::error_code ignored;
  socket_.non_blocking(true, ignored);
  // Not from inside lwIP's accept callback: pumping may abort the pcb.
  asio::post(core_.io, [self = shared_from_this()] { self->pumpFromBoundary(); });
}

int8_t TcpFlow::onRecv(void* arg, tcp_pcb* /*pcb*/, pbuf* p, int8_t err) {
  auto* flow = static_cast<TcpFlow*>(arg);
  if (flow == nullptr) {
    if (p != nullptr) pbuf_free(p);
    return ERR_OK;
  }
  auto self = flow->shared_from_this();
  flow->in_callback_ = true;
  if (err != ERR_OK && p != nullptr) {
    pbuf_free(p);
  } else {
    flow->receive(p);
  }
  flow->in_callback_ = false;
  return ERR_OK;
}

int8_t TcpFlow::onSent(void* arg, tcp_pcb* /*pcb*/, uint16_t /*len*/) {
  auto* flow = static_cast<TcpFlow*>(arg);
  if (flow == nullptr) return ERR_OK;
  auto self = flow->shared_from_this();
  flow->touch();
  // Continue outside the callback: pumping may finish or abort the flow.
  asio::post(flow->core_.io, [self] {
    if (self->local_dns_) {
      self->serveDns();
    } else if (self->paused_) {
      self->paused_ = false;
      self->pumpFromBoundary();
    }
  });
  return ERR_OK;
}

void TcpFlow::onError(void* arg, int8_t /*err*/) {
  // lwIP already freed the pcb (the agent reset, or retransmissions ran out).
  auto* flow = static_cast<TcpFlow*>(arg);
  if (flow == nullptr) return;
  auto self = flow->shared_from_this();
  flow->pcb_ = nullptr;
  asio::post(flow->core_.io, [self] { self->close(); });
}

void TcpFlow::receive(pbuf* p) {
  touch();
  if (p == nullptr) {
    agent_eof_ = true;
    if (local_dns_) {
      defer([this] { serveDns(); });
    } else {
      flushToBoundary();
    }
    return;
  }
  bytes_up_ += p->tot_len;
  if (local_dns_) {
    if (dns_in_.size() + p->tot_len > kMaxDnsTcpBuffer) {
      pbuf_free(p);
      abort("dns over tcp: query too large");
      return;
    }
    const size_t old = dns_in_.size();
    dns_in_.resize(old + p->tot_len);
    pbuf_copy_partial(p, dns_in_.data() + old, p->tot_len, 0);
    pbuf_free(p);  // acknowledged to the agent's window only once answered (serveDns)
    defer([this] { serveDns(); });
    return;
  }
  to_boundary_.push_back(p);
  if (core_.in_batch) {
    // More segments of this flow may be in the same batch: write them all at once after it.
    if (!flush_queued_) {
      flush_queued_ = true;
      core_.flush_after_batch.push_back(shared_from_this());
    }
    return;
  }
  flushToBoundary();
}

void TcpFlow::flushAfterBatch() {
  flush_queued_ = false;
  if (state_ != State::kClosed) flushToBoundary();
}

void TcpFlow::flushToBoundary() {
  while (!to_boundary_.empty() && !write_waiting_) {
    iovec iov[kMaxIovecs];
    int n = 0;
    size_t skip = front_offset_;
    for (pbuf* head : to_boundary_) {
      for (pbuf* q = head; q != nullptr && n < kMaxIovecs; q = q->next) {
        if (skip >= q->len) {
          skip -= q->len;
          continue;
        }
        iov[n].iov_base = static_cast<char*>(q->payload) + skip;
        iov[n].iov_len = q->len - skip;
        skip = 0;
        ++n;
      }
      if (n == kMaxIovecs) break;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    const ssize_t written = ::sendmsg(socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        waitBoundaryWritable();
        return;
      }
      abort("boundary write failed");
      return;
    }
    size_t left = static_cast<size_t>(written);
    while (left > 0) {
      pbuf* head = to_boundary_.front();
      const size_t remain = head->tot_len - front_offset_;
      if (left >= remain) {
        left -= remain;
        pbuf_free(head);
        to_boundary_.pop_front();
        front_offset_ = 0;
      } else {
        front_offset_ += left;
        left = 0;
      }
    }
    // Only now may the agent send more: the window reopens by what the boundary took.
    reopenWindow(static_cast<size_t>(written));
    touch();
  }
  if (to_boundary_.empty() && agent_eof_ && !boundary_shut_wr_) {
    boundary_shut_wr_ = true;
    asio::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
    defer([this] { maybeFinish(); });
  }
}

void TcpFlow::waitBoundaryWritable() {
  write_waiting_ = true;
  socket_.async_wait(asio::socket_base::wait_write,
                     [self = shared_from_this()](const asio::error_code& ec) {
                       self->write_waiting_ = false;
                       if (ec || self->state_ == State::kClosed) return;
                       self->flushToBoundary();
                     });
}

void TcpFlow::readBoundary() {
  if (read_waiting_ || boundary_eof_ || pcb_ == nullptr || state_ == State::kClosed) return;
  read_waiting_ = true;
  socket_.async_wait(asio::socket_base::wait_read,
                     [self = shared_from_this()](const asio::error_code& ec) {
                       self->read_waiting_ = false;
                       if (ec || self->state_ == State::kClosed) return;
                       self->pumpFromBoundary();
                     });
}

bool TcpFlow::writePendingToAgent() {
  while (!to_agent_.empty() && pcb_ != nullptr) {
    const size_t room = std::min<size_t>(tcp_sndbuf(pcb_), 0xffff);
    if (room == 0 || tcp_sndqueuelen(pcb_) + kQueueHeadroom >= TCP_SND_QUEUELEN) return false;
    const size_t n = std::min(room, to_agent_.size());
    if (tcp_write(pcb_, to_agent_.data(), static_cast<u16_t>(n), TCP_WRITE_FLAG_COPY) != ERR_OK) {
      return false;
    }
    to_agent_.erase(0, n);
    bytes_down_ += n;
  }
  if (pcb_ != nullptr) tcp_output(pcb_);
  return to_agent_.empty();
}

void TcpFlow::pumpFromBoundary() {
  if (pcb_ == nullptr || state_ != State::kEstablished) return;
  if (!writePendingToAgent()) {
    paused_ = true;
    return;
  }
  if (boundary_eof_) return;
  const size_t room = tcp_sndbuf(pcb_);
  if (room == 0 || tcp_sndqueuelen(pcb_) + kQueueHeadroom >= TCP_SND_QUEUELEN) {
    paused_ = true;  // onSent resumes us once the agent acknowledged data
    return;
  }
  const size_t want = std::min({room, core_.scratch.size(), size_t{0xffff}});
  const ssize_t n = ::recv(socket_.native_handle(), core_.scratch.data(), want, MSG_DONTWAIT);
  if (n > 0) {
    touch();
    if (tcp_write(pcb_, core_.scratch.data(), static_cast<u16_t>(n), TCP_WRITE_FLAG_COPY) ==
        ERR_OK) {
      bytes_down_ += static_cast<uint64_t>(n);
    } else {
      to_agent_.assign(core_.scratch.data(), static_cast<size_t>(n));  // ≤ one read
    }
    tcp_output(pcb_);
    core_.lwip.kickTimers();
    readBoundary();
  } else if (n == 0) {
    boundary_eof_ = true;
    tcp_shutdown(pcb_, 0, 1);  // FIN to the agent after the data lwIP still holds
    core_.lwip.kickTimers();
    maybeFinish();
  } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    readBoundary();
  } else {
    abort("boundary read failed");
  }
}

void TcpFlow::reopenWindow(size_t bytes) {
  while (bytes > 0 && pcb_ != nullptr) {
    const auto chunk = static_cast<u16_t>(std::min<size_t>(bytes, 0xffff));  // tcp_recved's type
    tcp_recved(pcb_, chunk);
    bytes -= chunk;
  }
}

namespace {
// The first DNS-over-TCP message in `in` (RFC 7766 §8: a 2-byte length, then the message):
// its length, or nullopt while it is incomplete.
std::optional<size_t> wholeQuery(const std::string& in) {
  if (in.size() < 2) return std::nullopt;
  const size_t len = size_t{static_cast<uint8_t>(in[0])} << 8 | static_cast<uint8_t>(in[1]);
  if (in.size() < 2 + len) return std::nullopt;
  return len;
}
}  // namespace

void TcpFlow::serveDns() {
  if (state_ == State::kClosed || pcb_ == nullptr) return;
  while (to_agent_.size() < kMaxDnsAnswerBacklog) {
    const std::optional<size_t> query = wholeQuery(dns_in_);
    if (!query) break;
    const size_t len = *query;
    const std::string answer = core_.answerDns(std::string_view(dns_in_).substr(2, len));
    dns_in_.erase(0, 2 + len);
    reopenWindow(2 + len);
    if (answer.empty() || answer.size() > 0xffff) continue;
    to_agent_.push_back(static_cast<char>(answer.size() >> 8));
    to_agent_.push_back(static_cast<char>(answer.size() & 0xff));
    to_agent_ += answer;
  }
  // After the agent's FIN, finish only once every whole query it sent is answered: the
  // backlog may have paused answering, and onSent() resumes it.
  if (writePendingToAgent() && agent_eof_ && !wholeQuery(dns_in_)) finish();
}

void TcpFlow::maybeFinish() {
  if (agent_eof_ && boundary_shut_wr_ && boundary_eof_ && to_agent_.empty()) finish();
}

template <typename Fn>
void TcpFlow::defer(Fn fn) {
  if (!in_callback_) {
    fn();
    return;
  }
  asio::post(core_.io, [self = shared_from_this(), fn = std::move(fn)] {
    if (self->state_ != State::kClosed) fn();
  });
}

void TcpFlow::finish() {
  defer([this] {
    auto self = shared_from_this();
    if (pcb_ != nullptr) {
      tcp_pcb* pcb = pcb_;
      detachPcb();
      if (tcp_close(pcb) != ERR_OK) tcp_abort(pcb);
    }
    close();
  });
}

void TcpFlow::abort(const char* why) {
  defer([this, why] {
    auto self = shared_from_this();
    log::debug("tcp flow reset", {{"target", authority_}, {"why", why}});
    if (pcb_ != nullptr) {
      tcp_pcb* pcb = pcb_;
      detachPcb();
      tcp_abort(pcb);  // RST to the agent
    } else if (state_ == State::kOpening) {
      refuse(-1, why);
      return;
    }
    close();
  });
}

void TcpFlow::detachPcb() {
  if (pcb_ == nullptr) return;
  tcp_arg(pcb_, nullptr);
  tcp_recv(pcb_, nullptr);
  tcp_sent(pcb_, nullptr);
  tcp_err(pcb_, nullptr);
  pcb_ = nullptr;
}

void TcpFlow::close() {
  if (state_ == State::kClosed) return;
  release();
  // Last: erasing may destroy this flow.
  auto it = core_.tcp_flows.find(key_);
  if (it != core_.tcp_flows.end() && it->second.get() == this) core_.tcp_flows.erase(it);
}

void TcpFlow::release() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  if (pcb_ != nullptr) {
    tcp_pcb* pcb = pcb_;
    detachPcb();
    tcp_abort(pcb);
  }
  for (pbuf* p : to_boundary_) pbuf_free(p);
  to_boundary_.clear();
  asio::error_code ignored;
  socket_.close(ignored);
  if (counted_pending_) {
    --core_.pending_syns;
    counted_pending_ = false;
  }
  if (holds_listener_) {
    holds_listener_ = false;
    core_.lwip.releaseListener(key_.dst.port);
  }
  if (name_) core_.flowClosed(key_.dst);
  if (!local_dns_ && bytes_up_ + bytes_down_ > 0) {
    log::debug("tcp flow closed",
               {{"target", authority_}, {"bytes_up", bytes_up_}, {"bytes_down", bytes_down_}});
  }
}

void TcpFlow::sweep(Clock::time_point now) {
  if (state_ == State::kHandshaking && now - started_ > kHandshakeTimeout) {
    ++core_.counters.handshake_timeouts;
    close();
  } else if (state_ == State::kEstablished && now - last_activity_ > kTcpIdleTimeout) {
    ++core_.counters.tcp_idle_timeouts;
    abort("idle timeout");
  }
}

}  // namespace netstack
