#include "netstack/udp_flow.h"

#include "netstack/log.h"

#include <sys/socket.h>

#include <asio/co_spawn.hpp>
#include <asio/write.hpp>
#include <cerrno>

namespace netstack {

UdpFlow::UdpFlow(Core& core, const FlowKey& key) : core_(core), key_(key), socket_(core.io) {}

UdpFlow::~UdpFlow() { release(); }

void UdpFlow::start() {
  name_ = core_.nameFor(key_.dst);
  if (name_) core_.flowOpened(key_.dst);
  target_ = tunnelAuthority(key_.dst, name_);
  auto self = shared_from_this();
  asio::co_spawn(core_.io, openTunnel(socket_, core_.boundary, connectUdpRequest(key_.dst, name_)),
                 [self](std::exception_ptr error, TunnelResult result) {
                   if (error) {
                     result.status = -1;
                     result.detail = "tunnel client failed";
                   }
                   self->onVerdict(result.status, result.detail, std::move(result.leftover));
                 });
}

void UdpFlow::onVerdict(int status, const std::string& detail, std::string leftover) {
  if (state_ != State::kOpening) return;
  last_activity_ = Clock::now();
  if (status != 101) {
    ++core_.counters.udp_refused;
    logRefusedFlow("udp flow refused", target_, status, detail);
    state_ = State::kRefused;
    sendUnreachable(std::move(unreachable_));
    queued_.clear();
    queued_datagrams_ = 0;
    asio::error_code ignored;
    socket_.close(ignored);
    return;
  }
  ++core_.counters.udp_accepted;
  state_ = State::kOpen;
  asio::error_code ignored;
  socket_.non_blocking(true, ignored);
  deliver(leftover);
  flush();
  read();
}

void UdpFlow::send(std::string_view payload) {
  if (state_ == State::kRefused) {
    // A refused flow's hold runs from the refusal, not from the datagrams that keep coming.
    if (Clock::now() - last_unreachable_ >= kUdpUnreachableInterval) {
      sendUnreachable(buildUdpPortUnreachable(key_.src, key_.dst, payload));
    }
    return;
  }
  if (state_ == State::kClosed) return;
  if (state_ == State::kOpening && unreachable_.empty()) {
    unreachable_ = buildUdpPortUnreachable(key_.src, key_.dst, payload);
  }
  last_activity_ = Clock::now();
  if (queued_datagrams_ >= kMaxUdpQueuedDatagrams ||
      queued_.size() + payload.size() + 16 > kMaxUdpQueuedBytes) {
    ++core_.counters.udp_queue_cap;
    return;
  }
  proto::appendDatagramCapsule(payload, &queued_);
  ++queued_datagrams_;
  if (state_ == State::kOpen) flush();
}

void UdpFlow::flush() {
  if (write_active_ || queued_.empty() || state_ != State::kOpen) return;
  writing_.swap(queued_);
  queued_.clear();
  queued_datagrams_ = 0;
  write_active_ = true;
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const asio::error_code& ec, size_t) {
                      self->write_active_ = false;
                      self->writing_.clear();
                      if (self->state_ != State::kOpen) return;
                      if (ec) {
                        self->close();
                        return;
                      }
                      self->flush();
                    });
}

void UdpFlow::read() {
  if (read_waiting_ || state_ != State::kOpen) return;
  read_waiting_ = true;
  socket_.async_wait(
      asio::socket_base::wait_read, [self = shared_from_this()](const asio::error_code& ec) {
        self->read_waiting_ = false;
        if (ec || self->state_ != State::kOpen) return;
        const ssize_t n = ::recv(self->socket_.native_handle(), self->core_.scratch.data(),
                                 self->core_.scratch.size(), MSG_DONTWAIT);
        if (n > 0) {
          self->deliver({self->core_.scratch.data(), static_cast<size_t>(n)});
          if (self->state_ == State::kOpen) self->read();
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          self->read();
        } else {
          self->close();  // the boundary ended the tunnel
        }
      });
}

void UdpFlow::deliver(std::string_view bytes) {
  if (bytes.empty()) return;
  last_activity_ = Clock::now();
  reader_.append(bytes);
  for (;;) {
    const auto status = reader_.next();
    if (status == proto::CapsuleReader::Status::kNeedMore) return;
    if (status == proto::CapsuleReader::Status::kTooLarge) {
      close();
      return;
    }
    // From the destination back to the agent's socket.
    const std::string packet = buildUdp(key_.dst, key_.src, reader_.payload());
    if (!packet.empty()) {
      core_.lwip.writeTun({reinterpret_cast<const uint8_t*>(packet.data()), packet.size()});
    }
  }
}

void UdpFlow::sendUnreachable(std::string packet) {
  if (packet.empty()) return;
  last_unreachable_ = Clock::now();
  ++core_.counters.udp_unreachable;
  core_.lwip.writeTun({reinterpret_cast<const uint8_t*>(packet.data()), packet.size()});
}

void UdpFlow::sweep(Clock::time_point now) {
  const auto hold = state_ == State::kRefused
                        ? std::chrono::duration_cast<Clock::duration>(kUdpRefusalHold)
                        : std::chrono::duration_cast<Clock::duration>(kUdpIdleTimeout);
  if (now - last_activity_ > hold) close();
}

void UdpFlow::close() {
  if (state_ == State::kClosed) return;
  release();
  auto it = core_.udp_flows.find(key_);
  if (it != core_.udp_flows.end() && it->second.get() == this) core_.udp_flows.erase(it);
}

void UdpFlow::release() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  asio::error_code ignored;
  socket_.close(ignored);
  if (name_) core_.flowClosed(key_.dst);
}

}  // namespace netstack
