#pragma once
// Capsules (RFC 9297 §3.2) carrying UDP payloads for connect-udp (RFC 9298 §5): a DATAGRAM
// capsule (type 0x00) whose value is a Context ID (variable-length integer, RFC 9000 §16)
// followed by the payload; Context ID 0 means "a whole UDP payload". Unknown capsule types
// are skipped, as RFC 9297 §3.2 requires; datagrams with another Context ID are dropped.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace proto {

/// Largest capsule value accepted, in bytes: a maximal UDP payload plus its Context ID.
inline constexpr size_t kMaxCapsuleValueBytes = 65535 + 8;
/// Capsule type of DATAGRAM (RFC 9297 §3.5).
inline constexpr uint64_t kDatagramCapsuleType = 0x00;

/// Appends `value` as a QUIC variable-length integer (RFC 9000 §16) to `out`.
/// `value` must be < 2^62; larger values are a programming error (std::invalid_argument).
void appendVarint(uint64_t value, std::string* out);

/// Decodes a variable-length integer at the start of `in`. Returns the value and sets
/// `*used` to its length (1, 2, 4 or 8 bytes), or std::nullopt if `in` is too short.
std::optional<uint64_t> readVarint(std::string_view in, size_t* used);

/// Appends one DATAGRAM capsule with Context ID 0 carrying `payload` (≤ 65535 bytes).
void appendDatagramCapsule(std::string_view payload, std::string* out);

/// Incremental decoder for a capsule stream.
class CapsuleReader {
 public:
  enum class Status {
    kNeedMore,  ///< no complete capsule buffered
    kDatagram,  ///< payload() holds one UDP payload
    kTooLarge,  ///< a capsule value over kMaxCapsuleValueBytes: close the stream
  };

  /// Appends received bytes to the internal buffer (bounded by one capsule plus `data`).
  void append(std::string_view data) { buffer_.append(data); }
  /// Decodes the next datagram, skipping unknown capsules and non-zero Context IDs.
  Status next();
  /// The payload of the last kDatagram; valid until the next call to next() or append().
  [[nodiscard]] std::string_view payload() const { return payload_; }
  /// Bytes buffered and not yet decoded.
  [[nodiscard]] size_t buffered() const { return buffer_.size() - offset_; }

 private:
  std::string buffer_;
  size_t offset_ = 0;
  std::string_view payload_;
};

}  // namespace proto
