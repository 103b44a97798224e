#include "timeline/event_batch.h"

namespace horo {
namespace {

// Record kinds. A batch is a sequence of records closed by kEnd, which holds the shipping time and
// whether the rank stopped recording: the last kEndBytes bytes of every batch.
enum RecordKind : uint8_t { kGroup = 1, kEvent = 2, kMarker = 3, kEnd = 4 };
constexpr size_t kEndBytes = 1 + 8 + 1;

bool IsPhase(char phase) { return phase == 'B' || phase == 'E' || phase == 'X'; }

}  // namespace

int32_t EventBatch::AddGroup(int32_t process_set_id, const std::vector<TraceTensor>& tensors) {
  out_.U8(kGroup);
  out_.I32(process_set_id);
  out_.I64(static_cast<int64_t>(tensors.size()));
  for (const TraceTensor& t : tensors) {
    out_.Str(t.name);
    out_.I32(t.dtype);
    out_.I64Vec(t.shape);
  }
  ++records_;
  last_single_set_ = -1;
  return groups_++;
}

int32_t EventBatch::AddTensor(int32_t process_set_id, const std::string& name) {
  if (last_single_set_ == process_set_id && last_single_name_ == name) return groups_ - 1;
  out_.U8(kGroup);
  out_.I32(process_set_id);
  out_.I64(1);
  out_.Str(name);
  out_.I32(-1);
  out_.I64Vec({});
  ++records_;
  last_single_set_ = process_set_id;
  last_single_name_ = name;
  return groups_++;
}

void EventBatch::AddEvent(int32_t group, TraceTrack track, char phase, int64_t ts_us, const std::string& name,
                          bool tensor_args, const TraceArgs& args) {
  out_.U8(kEvent);
  out_.I32(group);
  out_.U8(static_cast<uint8_t>(track));
  out_.U8(static_cast<uint8_t>(phase));
  out_.I64(ts_us);
  out_.Str(name);
  out_.U8(tensor_args ? 1 : 0);
  out_.I64(static_cast<int64_t>(args.size()));
  for (const auto& kv : args) {
    out_.Str(kv.first);
    out_.Str(kv.second);
  }
  ++records_;
}

void EventBatch::AddMarker(int64_t ts_us, const std::string& name) {
  out_.U8(kMarker);
  out_.I64(ts_us);
  out_.Str(name);
  ++records_;
}

std::string EventBatch::Take(bool final, int64_t shipped_us) {
  out_.U8(kEnd);
  out_.I64(shipped_us);
  out_.U8(final ? 1 : 0);
  std::string bytes = out_.Take();
  *this = EventBatch();
  return bytes;
}

Status ParseEventBatch(const std::string& bytes, ParsedEventBatch* out) {
  WireReader rd(bytes);
  ParsedEventBatch batch;
  while (rd.ok()) {
    const uint8_t kind = rd.U8();
    if (!rd.ok()) break;
    if (kind == kEnd) {
      batch.shipped_us = rd.I64();
      batch.final = rd.U8() != 0;
      if (!rd.ok() || !rd.AtEnd()) return Status::Internal("timeline batch: trailing bytes after the end record");
      *out = std::move(batch);
      return Status::OK();
    }
    if (kind == kGroup) {
      ParsedEventBatch::Group g;
      g.process_set_id = rd.I32();
      const int64_t n = rd.I64();
      if (!rd.ok() || n < 0 || n > static_cast<int64_t>(bytes.size())) break;
      g.tensors.resize(n);
      for (TraceTensor& t : g.tensors) {
        t.name = rd.Str();
        t.dtype = rd.I32();
        t.shape = rd.I64Vec();
      }
      batch.groups.push_back(std::move(g));
    } else if (kind == kEvent) {
      ParsedEventBatch::Event e;
      e.group = rd.I32();
      const uint8_t track = rd.U8();
      e.phase = static_cast<char>(rd.U8());
      e.ts_us = rd.I64();
      e.name = rd.Str();
      e.tensor_args = rd.U8() != 0;
      const int64_t n = rd.I64();
      if (!rd.ok() || n < 0 || n > static_cast<int64_t>(bytes.size())) break;
      for (int64_t i = 0; i < n; ++i) {
        std::string key = rd.Str();
        e.args.emplace_back(std::move(key), rd.Str());
      }
      if (!rd.ok()) break;
      if (e.group < 0 || e.group >= static_cast<int32_t>(batch.groups.size()) || track > 1 || !IsPhase(e.phase)) {
        return Status::Internal("timeline batch: malformed event");
      }
      e.track = static_cast<TraceTrack>(track);
      batch.events.push_back(std::move(e));
    } else if (kind == kMarker) {
      ParsedEventBatch::Event e;
      e.marker = true;
      e.phase = 'i';
      e.ts_us = rd.I64();
      e.name = rd.Str();
      batch.events.push_back(std::move(e));
    } else {
      return Status::Internal("timeline batch: unknown record kind " + std::to_string(kind));
    }
  }
  return Status::Internal("timeline batch: truncated or malformed");
}

bool ReadBatchEnd(const std::string& bytes, bool* final, int64_t* shipped_us) {
  if (bytes.size() < kEndBytes) return false;
  const std::string end = bytes.substr(bytes.size() - kEndBytes);
  WireReader rd(end);
  if (rd.U8() != kEnd) return false;
  *shipped_us = rd.I64();
  *final = rd.U8() != 0;
  return rd.ok();
}

}  // namespace horo
