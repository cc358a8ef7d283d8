// The SYN hold with the real lwIP: a SYN fed only after the verdict is answered with a
// SYN-ACK from the dialled address, and the handshake then completes into lwIP's accept.

#include "netstack/lwip_glue.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "test_packets.h"

extern "C" {
#include "lwip/tcp.h"
}

namespace netstack {
namespace {

using testing::kAgent4;
using testing::kAgent6;
using testing::kSynthetic4;
using testing::kSynthetic6;
using testing::makePacket;

struct Accepted {
  int count = 0;
  uint16_t local_port = 0;
};

int8_t acceptAndReset(void* arg, tcp_pcb* pcb, int8_t /*err*/) {
  auto* accepted = static_cast<Accepted*>(arg);
  ++accepted->count;
  accepted->local_port = pcb->local_port;
  tcp_abort(pcb);
  return ERR_ABRT;
}

class LwipGlueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, fds_), 0);
    glue_ = std::make_unique<LwipGlue>(io_, fds_[0], counters_);
    glue_->start(1500, &acceptAndReset, &accepted_);
  }
  void TearDown() override {
    glue_.reset();
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void feed(const std::vector<uint8_t>& bytes) {
    Packet p;
    ASSERT_EQ(parsePacket(bytes, &p), ParseStatus::kOk);
    glue_->input(bytes, p);
  }
  /// The next packet lwIP wrote to "tun0", parsed (its checksums must be valid).
  std::optional<Packet> next() {
    last_.resize(65536);
    const ssize_t n = ::recv(fds_[1], last_.data(), last_.size(), 0);
    if (n <= 0) return std::nullopt;
    last_.resize(static_cast<size_t>(n));
    Packet p;
    if (parsePacket(last_, &p) != ParseStatus::kOk) return std::nullopt;
    return p;
  }

  int fds_[2] = {-1, -1};
  asio::io_context io_;
  Counters counters_;
  Accepted accepted_;
  std::unique_ptr<LwipGlue> glue_;
  std::vector<uint8_t> last_;
};

TEST_F(LwipGlueTest, HeldSynIsAnsweredFromTheDialledAddress) {
  for (bool v6 : {false, true}) {
    const auto& agent = v6 ? kAgent6 : kAgent4;
    const auto& dialled = v6 ? kSynthetic6 : kSynthetic4;
    const uint16_t sport = v6 ? 40001 : 40000;
    ASSERT_TRUE(glue_->acquireListener(8443));
    feed(makePacket(v6, agent, dialled, sport, 8443, kProtoTcp, kTcpSyn, 1000));
    auto synack = next();
    ASSERT_TRUE(synack);
    EXPECT_EQ(synack->tcp_flags, kTcpSyn | kTcpAck);
    EXPECT_EQ(synack->ack, 1001u);
    EXPECT_EQ(std::vector<uint8_t>(synack->key.src.addr.begin(),
                                   synack->key.src.addr.begin() + (v6 ? 16 : 4)),
              dialled);
    EXPECT_EQ(synack->key.src.port, 8443);
    EXPECT_EQ(synack->key.dst.port, sport);
    // The agent's final ACK completes the handshake into accept (which resets it here).
    const int before = accepted_.count;
    const uint32_t ack = synack->seq + 1;
    auto final_ack = makePacket(v6, agent, dialled, sport, 8443, kProtoTcp, kTcpAck, 1001);
    const size_t tcp = v6 ? 40 : 20;
    testing::put32(final_ack, tcp + 8, ack);
    final_ack[tcp + 16] = final_ack[tcp + 17] = 0;  // checksum again, over the new ack
    uint32_t sum = checksumAdd({final_ack.data() + (v6 ? 8 : 12), v6 ? 32u : 8u});
    sum += kProtoTcp + 20;
    testing::put16(final_ack, tcp + 16,
                   checksumFinish(checksumAdd({final_ack.data() + tcp, 20}, sum)));
    feed(final_ack);
    EXPECT_EQ(accepted_.count, before + 1);
    EXPECT_EQ(accepted_.local_port, 8443);
    auto rst = next();  // accept reset it: the agent sees the RST
    ASSERT_TRUE(rst);
    EXPECT_TRUE(rst->tcp_flags & kTcpRst);
    glue_->releaseListener(8443);
  }
}

TEST_F(LwipGlueTest, ListenerRebindsBesideALiveConnection) {
  ASSERT_TRUE(glue_->acquireListener(9000));
  feed(makePacket(false, kAgent4, kSynthetic4, 41000, 9000, kProtoTcp, kTcpSyn, 5));
  ASSERT_TRUE(next());
  glue_->releaseListener(9000);  // the SYN_RCVD connection keeps local port 9000
  EXPECT_TRUE(glue_->acquireListener(9000));
  glue_->releaseListener(9000);
}

}  // namespace
}  // namespace netstack
