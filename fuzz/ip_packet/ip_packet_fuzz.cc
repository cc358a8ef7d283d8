// Fuzzes IP packet intake (issue 3): the bytes an agent's kernel writes to tun0 go through
// netstack's parser, the packets built in answer (RST, UDP) must parse back, and TCP
// segments reach the real lwIP through the same glue as in nano-init, with a listener on
// port 80 so handshakes happen. Checksums are repaired first so inputs get past them.

#include "netstack/lwip_glue.h"
#include "netstack/packet.h"

#include <fcntl.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <cstdint>
#include <cstdlib>
#include <vector>

extern "C" {
#include "lwip/tcp.h"
}

namespace {

using netstack::checksumAdd;
using netstack::checksumFinish;

int8_t resetOnAccept(void*, tcp_pcb* pcb, int8_t) {
  tcp_abort(pcb);
  return ERR_ABRT;
}

netstack::LwipGlue& glue() {
  static asio::io_context io;
  static netstack::Counters counters;
  static const int sink = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  static netstack::LwipGlue* g = [] {
    auto* made = new netstack::LwipGlue(io, sink, counters);
    made->start(1500, &resetOnAccept, nullptr);
    made->acquireListener(80);
    return made;
  }();
  return *g;
}

void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

// Rewrites the IPv4 header checksum and the TCP/UDP checksum, where lengths allow.
void repairChecksums(std::vector<uint8_t>& b) {
  if (b.empty()) return;
  size_t hlen = 0;
  size_t total = 0;
  uint8_t proto = 0;
  uint32_t pseudo = 0;
  if (b[0] >> 4 == 4 && b.size() >= 20) {
    hlen = (b[0] & 0x0fu) * 4u;
    total = static_cast<size_t>(b[2] << 8 | b[3]);
    if (hlen < 20 || total < hlen || total > b.size()) return;
    put16(&b[10], 0);
    put16(&b[10], checksumFinish(checksumAdd({b.data(), hlen})));
    proto = b[9];
    pseudo = checksumAdd({b.data() + 12, 8});
  } else if (b[0] >> 4 == 6 && b.size() >= 40) {
    hlen = 40;
    total = 40 + static_cast<size_t>(b[4] << 8 | b[5]);
    if (total > b.size()) return;
    proto = b[6];
    pseudo = checksumAdd({b.data() + 8, 32});
  } else {
    return;
  }
  const size_t l4 = total - hlen;
  size_t at = 0;
  if (proto == netstack::kProtoTcp && l4 >= 20) at = hlen + 16;
  if (proto == netstack::kProtoUdp && l4 >= 8) at = hlen + 6;
  if (at == 0) return;
  put16(&b[at], 0);
  pseudo += proto;
  pseudo += static_cast<uint32_t>(l4);
  put16(&b[at], checksumFinish(checksumAdd({b.data() + hlen, l4}, pseudo)));
}

void intake(const std::vector<uint8_t>& bytes) {
  netstack::Packet packet;
  if (netstack::parsePacket(bytes, &packet) != netstack::ParseStatus::kOk) return;
  if (packet.protocol == netstack::kProtoTcp) {
    const std::string rst = netstack::buildTcpRst(packet);
    netstack::Packet back;
    const std::vector<uint8_t> rst_bytes(rst.begin(), rst.end());
    if (netstack::parsePacket(rst_bytes, &back) != netstack::ParseStatus::kOk) std::abort();
    glue().input(bytes, packet);
  } else {
    const std::string reply = netstack::buildUdp(packet.key.dst, packet.key.src, packet.payload);
    netstack::Packet back;
    const std::vector<uint8_t> reply_bytes(reply.begin(), reply.end());
    if (!reply.empty() &&
        (netstack::parsePacket(reply_bytes, &back) != netstack::ParseStatus::kOk ||
         back.payload != packet.payload)) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 65535) return 0;
  std::vector<uint8_t> bytes(data, data + size);
  intake(bytes);
  repairChecksums(bytes);
  intake(bytes);
  return 0;
}
