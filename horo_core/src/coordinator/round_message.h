// RoundMessage: what one rank tells every peer in one round of the agreement between the ranks
// (peer_agreement.h), and its wire format.
//
// A message lists the cached ids this rank submitted since its last message (with, for a small
// collective that travels with its data, this rank's input bytes, and the id of the group each
// belongs to), the ids it invalidated, and the process sets it joined. On the wire it follows
// wire.h's layout after a one-byte tag, 'R', which tells it apart from the request and response
// lists that share the control plane (their first byte is 0 or 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace horo {

struct RoundMessage {
  int64_t round = 0;
  std::vector<int64_t> hits;         // cached ids this rank submitted since its last message
  std::vector<std::string> data;     // per hit: this rank's input bytes (small allreduce), or empty
  std::vector<int64_t> units;        // per hit: the id of its group's first member (its own id alone)
  std::vector<int64_t> invalid;      // cached ids whose names this rank submitted with other parameters
  std::vector<int32_t> joined_sets;  // process sets this rank joined ...
  std::vector<int64_t> join_numbers; // ... for the n-th time in that set

  bool empty() const { return hits.empty() && invalid.empty() && joined_sets.empty(); }
  // Empties every field, keeping the vectors' storage for the next message.
  void Clear();
};

// Round messages share the control plane with request and response lists, whose first byte is 0
// or 1; theirs is 'R'.
bool IsRoundMessage(const std::string& payload);
// The round number of a round message, read without parsing the rest (false if payload is too
// short or not a round message).
bool RoundOfMessage(const std::string& payload, int64_t* round);
// Both reuse the storage of what they write into (*out is unspecified after a parse error): a
// round in the steady state then allocates nothing for its messages.
void SerializeRoundMessage(const RoundMessage& message, std::string* out);
Status ParseRoundMessage(const std::string& bytes, RoundMessage* out);

}  // namespace horo
