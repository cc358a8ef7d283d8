// Fuzzes sam-box's HTTP/2 server session (h2_session.h): the input follows the client preface
// on one end of a socketpair whose other end is the session's agent socket; the box allows no
// name and has no sidecar, so every stream is decided and refused without leaving the process.
// Nothing may crash, assert, leak or read out of bounds, whatever the frames.
#include <cstddef>
#include <cstdint>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/local/connect_pair.hpp>
#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "common/log.h"
#include "sam-box/h2_session.h"
#include "sam-box/options.h"
#include "sam-box/server.h"

namespace {

const sambox::Config& fuzzConfig() {
  static const sambox::Config config = [] {
    common::log::init("h2_session_fuzz", common::log::Level::kError);
    sambox::Flags flags;
    flags.socket = "/nonexistent/h2_session_fuzz.sock";  // never bound: start() is not called
    return sambox::buildConfig(flags);
  }();
  return config;
}

/// Reads what the session writes until it closes, so that its writer never blocks.
asio::awaitable<void> drain(asio::local::stream_protocol::socket& peer) {
  std::string sink;
  asio::error_code ec;
  co_await asio::async_read(peer, asio::dynamic_buffer(sink, size_t{1} << 24),
                            asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  asio::io_context io;
  sambox::Server server(io, fuzzConfig());
  asio::local::stream_protocol::socket agent(io);
  asio::local::stream_protocol::socket peer(io);
  asio::local::connect_pair(agent, peer);
  std::string received = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  received.append(reinterpret_cast<const char*>(data), size);
  asio::co_spawn(io, sambox::serveH2Connection(server, std::move(agent), std::move(received)),
                 asio::detached);
  peer.shutdown(asio::socket_base::shutdown_send);  // the agent has said all it will say
  asio::co_spawn(io, drain(peer), asio::detached);
  io.run();
  return 0;
}
