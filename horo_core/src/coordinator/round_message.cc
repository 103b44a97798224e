#include "coordinator/round_message.h"

#include <cstring>

#include "coordinator/wire.h"

namespace horo {
namespace {

constexpr uint8_t kRoundTag = 'R';

}  // namespace

bool IsRoundMessage(const std::string& payload) {
  return !payload.empty() && static_cast<uint8_t>(payload[0]) == kRoundTag;
}

bool RoundOfMessage(const std::string& payload, int64_t* round) {
  if (!IsRoundMessage(payload) || payload.size() < 1 + sizeof *round) return false;
  std::memcpy(round, payload.data() + 1, sizeof *round);  // the round follows the tag
  return true;
}

void RoundMessage::Clear() {
  round = 0;
  hits.clear();
  data.clear();
  units.clear();
  invalid.clear();
  joined_sets.clear();
  join_numbers.clear();
}

void SerializeRoundMessage(const RoundMessage& message, std::string* out) {
  // The layout WireReader reads (wire.h), written in place: one size computation and one resize
  // of a buffer that keeps its storage, instead of an append per field.
  const size_t hits = message.hits.size();
  size_t data_bytes = 0;
  for (size_t i = 0; i < hits && i < message.data.size(); ++i) data_bytes += message.data[i].size();
  const size_t total = 1 + 8 + (8 + 8 * hits) + (8 * hits + data_bytes) + (8 + 8 * hits) +
                       (8 + 8 * message.invalid.size()) + (8 + 4 * message.joined_sets.size()) +
                       (8 + 8 * message.join_numbers.size());
  out->resize(total);
  char* p = &(*out)[0];
  auto raw = [&p](const void* bytes, size_t n) {
    if (n) std::memcpy(p, bytes, n);
    p += n;
  };
  auto count = [&raw](size_t n) {
    const int64_t v = static_cast<int64_t>(n);
    raw(&v, 8);
  };
  *p++ = static_cast<char>(kRoundTag);
  raw(&message.round, 8);
  count(hits);
  raw(message.hits.data(), 8 * hits);
  for (size_t i = 0; i < hits; ++i) {
    const size_t n = i < message.data.size() ? message.data[i].size() : 0;
    count(n);
    if (n) raw(message.data[i].data(), n);
  }
  count(hits);
  for (size_t i = 0; i < hits; ++i) {  // a hit without a unit is a group of its own
    raw(i < message.units.size() ? &message.units[i] : &message.hits[i], 8);
  }
  count(message.invalid.size());
  raw(message.invalid.data(), 8 * message.invalid.size());
  count(message.joined_sets.size());
  raw(message.joined_sets.data(), 4 * message.joined_sets.size());
  count(message.join_numbers.size());
  raw(message.join_numbers.data(), 8 * message.join_numbers.size());
}

Status ParseRoundMessage(const std::string& bytes, RoundMessage* out) {
  WireReader rd(bytes);
  RoundMessage& m = *out;
  const uint8_t tag = rd.U8();
  m.round = rd.I64();
  rd.I64VecInto(&m.hits);
  m.data.resize(rd.ok() ? m.hits.size() : 0);
  for (std::string& d : m.data) rd.StrInto(&d);
  rd.I64VecInto(&m.units);
  if (m.units.size() != m.hits.size()) return Status::Internal("malformed round message: groups");
  rd.I64VecInto(&m.invalid);
  rd.I32VecInto(&m.joined_sets);
  rd.I64VecInto(&m.join_numbers);
  if (m.join_numbers.size() != m.joined_sets.size()) return Status::Internal("malformed round message: joins");
  if (!rd.ok() || !rd.AtEnd() || tag != kRoundTag || m.round < 1) return Status::Internal("malformed round message");
  return Status::OK();
}

}  // namespace horo
