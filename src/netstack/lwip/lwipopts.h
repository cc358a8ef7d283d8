#pragma once
// lwIP configuration for nano-init's userspace stack: NO_SYS (one thread, raw API, timers
// driven from the asio loop), TCP over IPv4 and IPv6 on one tun netif. Packets reach
// tcp_input() directly from netstack (lwip_glue.cc), so ARP, ICMP replies, DHCP, IGMP, MLD
// and the socket/netconn APIs are not used. UDP is terminated by netstack without lwIP.
// Memory comes from malloc, not lwIP's fixed pools: netstack bounds flows and buffers with
// its own named caps (limits.h), and lwIP's TCP windows bound each flow.

#define NO_SYS 1
#define LWIP_TIMERS 1
#define SYS_LIGHTWEIGHT_PROT 0
#define LWIP_NETCONN 0
#define LWIP_SOCKET 0
#define LWIP_NETIF_API 0

#define MEM_LIBC_MALLOC 1
#define MEMP_MEM_MALLOC 1
#define MEM_ALIGNMENT 8
#define MEMP_NUM_TCP_PCB 4096
#define MEMP_NUM_TCP_PCB_LISTEN 1024
#define MEMP_NUM_TCP_SEG 65535

#define LWIP_IPV4 1
#define LWIP_IPV6 1
#define LWIP_ARP 0
#define LWIP_ETHERNET 0
#define LWIP_ICMP 0
#define LWIP_RAW 0
#define LWIP_DHCP 0
#define LWIP_AUTOIP 0
#define LWIP_IGMP 0
#define LWIP_DNS 0
#define LWIP_UDP 0
#define IP_FORWARD 0
#define IP_REASSEMBLY 0
#define IP_FRAG 0
#define LWIP_IPV6_MLD 0
#define LWIP_IPV6_AUTOCONFIG 0
#define LWIP_IPV6_DUP_DETECT_ATTEMPTS 0
#define LWIP_IPV6_SEND_ROUTER_SOLICIT 0
#define LWIP_IPV6_REASS 0
#define LWIP_IPV6_FRAG 0
#define LWIP_IPV6_SCOPES 0
#define LWIP_ND6_QUEUEING 0
// Required on 64-bit targets (DESIGN.md): the fragment header struct would not fit otherwise.
#define IPV6_FRAG_COPYHEADER 1
#define LWIP_SINGLE_NETIF 1

#define LWIP_TCP 1
// The largest segment lwIP sends or advertises; the effective MSS is min(this, tun MTU - 40),
// so a tun0 with a 9000-byte MTU moves six times fewer packets than one with 1500, and one
// with 65520 (as pasta and slirp4netns use) over forty times fewer. Every packet costs a tun0
// read or write and a trip through the agent's kernel TCP, so packets, not bytes, are most of
// nano-init's cost (bench/nano_init_bench.py: at MTU 65520, 65000 instead of 16000 took a
// third off nano-init's CPU per GiB uploaded and a sixth off downloads). A segment plus its
// TCP and IPv6 headers stays below 65535, the limit of a pbuf's 16-bit length.
#define TCP_MSS 65000
// Window scaling so one flow can keep more than 64 KiB in flight on the fast local tun link.
#define LWIP_WND_SCALE 1
#define TCP_RCV_SCALE 3
#define TCP_WND (256 * 1024)
#define TCP_SND_BUF (256 * 1024)
// Segments are counted for the smallest MSS (536), so a 1500-byte tun0 still fills the buffer.
#define TCP_SND_QUEUELEN (4 * TCP_SND_BUF / 536)
// Only the socket API reads the low-water mark (select() writability); netstack uses the raw
// API and checks tcp_sndbuf() itself.
#define TCP_SNDLOWAT 1024
// lwIP's compile-time TCP sanity checks include "TCP_SNDLOWAT must be 4 * TCP_MSS below
// 0xFFFF", which no MSS above 16383 can meet. It guards a 16-bit snd_buf; LWIP_WND_SCALE makes
// it 32-bit (tcpwnd_size_t), and lwIP splits received chains longer than 64 KiB itself
// (pbuf_split_64k). lwip_glue.cc asserts every other check of that list, and the 32-bit
// window, with static_assert instead.
#define LWIP_DISABLE_TCP_SANITY_CHECKS 1
#define TCP_LISTEN_BACKLOG 0
#define TCP_QUEUE_OOSEQ 1
#define LWIP_TCP_KEEPALIVE 1
#define LWIP_CALLBACK_API 1
// Listeners come and go per destination port while connections to that port live on (they
// take the dialled port as their local port); SO_REUSE lets a new listener bind beside them.
#define SO_REUSE 1
#define LWIP_ALTCP 0
#define LWIP_TCP_TIMESTAMPS 0

#define LWIP_STATS 0
#define LWIP_NETIF_STATUS_CALLBACK 0
#define LWIP_NETIF_LINK_CALLBACK 0
#define LWIP_ERRNO_STDINCLUDE 1
#define LWIP_CHKSUM_ALGORITHM 3
// Every segment lwIP receives was checked first by netstack's parsePacket() (IPv4 header and
// TCP checksums; a bad one is dropped and counted as malformed): stack.cc feeds lwIP only
// packets that parsed kOk, and tcp_flow.cc replays a held SYN only after parsing it again.
// lwIP summing the same bytes a second time would only cost CPU. Outgoing checksums are still
// computed (LWIP_CHKSUM, arch/cc.h): tun0 has no checksum offload.
#define CHECKSUM_CHECK_IP 0
#define CHECKSUM_CHECK_TCP 0
