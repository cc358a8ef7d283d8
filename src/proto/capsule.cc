#include "proto/capsule.h"

#include <stdexcept>

namespace proto {

void appendVarint(uint64_t value, std::string* out) {
  if (value < (1ULL << 6)) {
    out->push_back(static_cast<char>(value));
  } else if (value < (1ULL << 14)) {
    out->push_back(static_cast<char>(0x40 | (value >> 8)));
    out->push_back(static_cast<char>(value & 0xff));
  } else if (value < (1ULL << 30)) {
    out->push_back(static_cast<char>(0x80 | (value >> 24)));
    for (int shift = 16; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
  } else if (value < (1ULL << 62)) {
    out->push_back(static_cast<char>(0xc0 | (value >> 56)));
    for (int shift = 48; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
  } else {
    throw std::invalid_argument("varint value must be below 2^62");
  }
}

std::optional<uint64_t> readVarint(std::string_view in, size_t* used) {
  if (in.empty()) return std::nullopt;
  const auto first = static_cast<unsigned char>(in[0]);
  const size_t len = size_t{1} << (first >> 6);
  if (in.size() < len) return std::nullopt;
  uint64_t value = first & 0x3f;
  for (size_t i = 1; i < len; ++i) value = (value << 8) | static_cast<unsigned char>(in[i]);
  *used = len;
  return value;
}

void appendDatagramCapsule(std::string_view payload, std::string* out) {
  appendVarint(kDatagramCapsuleType, out);
  appendVarint(payload.size() + 1, out);  // + the one-byte Context ID 0
  appendVarint(0, out);
  out->append(payload);
}

CapsuleReader::Status CapsuleReader::next() {
  // Compact once the consumed prefix dominates, so the buffer stays about one capsule long.
  if (offset_ > 0 && offset_ * 2 >= buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  for (;;) {
    std::string_view rest(buffer_);
    rest.remove_prefix(offset_);
    size_t type_len = 0;
    size_t length_len = 0;
    const auto type = readVarint(rest, &type_len);
    if (!type) return Status::kNeedMore;
    const auto length = readVarint(rest.substr(type_len), &length_len);
    if (!length) return Status::kNeedMore;
    if (*length > kMaxCapsuleValueBytes) return Status::kTooLarge;
    const size_t header = type_len + length_len;
    if (rest.size() < header + *length) return Status::kNeedMore;
    const std::string_view value = rest.substr(header, *length);
    offset_ += header + *length;
    if (*type != kDatagramCapsuleType) continue;  // RFC 9297 §3.2: skip unknown types
    size_t id_len = 0;
    const auto context_id = readVarint(value, &id_len);
    if (!context_id || *context_id != 0) continue;  // not a UDP payload: drop
    payload_ = value.substr(id_len);
    return Status::kDatagram;
  }
}

}  // namespace proto
