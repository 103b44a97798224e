#include "timeline/trace_file.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>

#include "common/dtype.h"

namespace horo {
namespace {

constexpr char kTrailer[] = "\n]\n";

// A JSON string literal: quotes, backslashes and control characters escaped, other bytes as they
// are (names come from Python strings, so they are valid UTF-8).
std::string Quoted(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string ArgsObject(const TraceArgs& args) {
  std::string out = "{";
  for (size_t i = 0; i < args.size(); ++i) {
    out += (i ? ", " : "") + Quoted(args[i].first) + ": " + Quoted(args[i].second);
  }
  return out + "}";
}

std::string Metadata(const char* what, int pid, const std::string& args, int64_t tid = -1) {
  std::string out = "{\"name\": \"" + std::string(what) + "\", \"ph\": \"M\", \"pid\": " + std::to_string(pid);
  if (tid >= 0) out += ", \"tid\": " + std::to_string(tid);
  return out + ", \"args\": " + args + "}";
}

}  // namespace

TraceFile::~TraceFile() { Close(); }

Status TraceFile::Open(const std::string& path, int64_t start_epoch_us, int world_size) {
  Close();
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Status::InvalidArgument("cannot open timeline file '" + path + "': " + std::strerror(errno));
  }
  file_ = f;
  path_ = path;
  seekable_ = std::ftell(f) == 0 && std::fseek(f, 0, SEEK_SET) == 0;
  body_end_ = 0;
  elements_ = 0;
  buffer_ = "[\n";
  start_epoch_us_ = start_epoch_us;
  max_ts_ = 0;
  world_size_ = std::max(1, world_size);
  tid_stride_ = 10;
  while (tid_stride_ <= world_size_) tid_stride_ *= 10;
  pids_.clear();
  tracks_.clear();
  // Horovod's header: pid 0 carries the wall-clock time of ts 0.
  Element(Metadata("process_name", 0, "{\"start_time_since_epoch_in_micros\": " + std::to_string(start_epoch_us) + "}"));
  Element(Metadata("process_sort_index", 0, "{\"sort_index\": 0}"));
  return Flush();
}

int TraceFile::TensorPid(int32_t process_set_id, const std::string& name) {
  auto key = std::make_pair(process_set_id, name);
  auto it = pids_.find(key);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(key, pid);
  std::string label = name;
  if (process_set_id != 0) label += " (process set " + std::to_string(process_set_id) + ")";
  Element(Metadata("process_name", pid, "{\"name\": " + Quoted(label) + "}"));
  Element(Metadata("process_sort_index", pid, "{\"sort_index\": " + std::to_string(pid) + "}"));
  return pid;
}

TraceFile::Track& TraceFile::TrackOf(int pid, int slot, int rank) {
  const int64_t tid = pid * tid_stride_ + slot;
  auto it = tracks_.find(tid);
  if (it != tracks_.end()) return it->second;
  const std::string label = slot == 0 ? "negotiation" : "rank " + std::to_string(rank);
  Element(Metadata("thread_name", pid, "{\"name\": " + Quoted(label) + "}", tid));
  Element(Metadata("thread_sort_index", pid, "{\"sort_index\": " + std::to_string(slot) + "}", tid));
  return tracks_[tid];
}

void TraceFile::Append(int rank, const ParsedEventBatch& batch, int64_t end_epoch_us) {
  if (file_ == nullptr || rank < 0 || rank >= world_size_) return;
  // Per group of the batch: each tensor's pid, 0 until first needed.
  std::vector<std::vector<int>> pids(batch.groups.size());
  for (const ParsedEventBatch::Event& e : batch.events) {
    const int64_t ts = e.ts_us - start_epoch_us_;
    if (ts < 0 || e.ts_us >= end_epoch_us) continue;  // before this file started, or from when it ended
    if (e.marker) {
      max_ts_ = std::max(max_ts_, ts);
      Element("{\"ph\": \"i\", \"name\": " + Quoted(e.name) + ", \"ts\": " + std::to_string(ts) + ", \"s\": \"g\"}");
      continue;
    }
    std::vector<int>& group_pids = pids[e.group];
    if (group_pids.empty()) group_pids.assign(batch.groups[e.group].tensors.size(), 0);
    AppendEvent(rank, batch.groups[e.group], &group_pids, e, ts);
  }
}

void TraceFile::AppendEvent(int rank, const ParsedEventBatch::Group& group, std::vector<int>* pids,
                            const ParsedEventBatch::Event& e, int64_t ts) {
  const int slot = e.track == TraceTrack::kNegotiation ? 0 : rank + 1;
  // What every tensor's line shares; an end closes the innermost slice and needs no name.
  std::string head = "{\"ph\": \"";
  head += e.phase;
  head += '"';
  if (e.phase != 'E') head += ", \"name\": " + Quoted(e.name);
  head += ", \"ts\": ";
  std::string tail;
  if (e.phase == 'X') tail += ", \"dur\": 0";
  for (size_t i = 0; i < group.tensors.size(); ++i) {
    const TraceTensor& tensor = group.tensors[i];
    int& pid = (*pids)[i];
    if (pid == 0) {
      if (e.phase == 'E') {
        // An end whose begin was dropped (recorded before this file started) is dropped too.
        auto known = pids_.find(std::make_pair(group.process_set_id, tensor.name));
        if (known == pids_.end()) continue;
        pid = known->second;
      } else {
        pid = TensorPid(group.process_set_id, tensor.name);
      }
    }
    if (e.phase == 'E' && tracks_.find(pid * tid_stride_ + slot) == tracks_.end()) continue;
    Track& track = TrackOf(pid, slot, rank);
    if (e.phase == 'E') {
      if (track.open == 0) continue;
      --track.open;
    } else if (e.phase == 'B') {
      ++track.open;
    }
    const int64_t t = std::max(ts, track.last_ts);
    track.last_ts = t;
    max_ts_ = std::max(max_ts_, t);
    StartElement();
    buffer_ += head;
    AppendNumber(t);
    buffer_ += ", \"pid\": ";
    AppendNumber(pid);
    buffer_ += ", \"tid\": ";
    AppendNumber(pid * tid_stride_ + slot);
    buffer_ += tail;
    TraceArgs args;
    if (e.tensor_args && tensor.dtype >= 0) {
      args.emplace_back("dtype", IsValidDataType(tensor.dtype) ? DataTypeName(static_cast<DataType>(tensor.dtype))
                                                              : "unknown");
      args.emplace_back("shape", ShapeText(tensor.shape));
    }
    args.insert(args.end(), e.args.begin(), e.args.end());
    if (!args.empty()) buffer_ += ", \"args\": " + ArgsObject(args);
    buffer_ += '}';
  }
}

void TraceFile::StartElement() {
  if (elements_++ > 0) buffer_ += ",\n";
}

void TraceFile::AppendNumber(int64_t value) {
  char digits[24];
  auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
  buffer_.append(digits, end);
}

void TraceFile::Element(const std::string& json) {
  StartElement();
  buffer_ += json;
}

Status TraceFile::Fail(const std::string& what) {
  const std::string message = "timeline file '" + path_ + "': " + what + ": " + std::strerror(errno);
  std::fclose(file_);
  file_ = nullptr;
  return Status::Internal(message);
}

Status TraceFile::Flush() {
  if (file_ == nullptr) return Status::OK();
  if (buffer_.empty()) return Status::OK();
  if (seekable_ && std::fseek(file_, body_end_, SEEK_SET) != 0) return Fail("seek failed");
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) return Fail("write failed");
  buffer_.clear();
  if (seekable_) {
    body_end_ = std::ftell(file_);
    // The next flush overwrites this closing bracket with ",\n" and its events.
    if (std::fwrite(kTrailer, 1, sizeof(kTrailer) - 1, file_) != sizeof(kTrailer) - 1) return Fail("write failed");
  }
  if (std::fflush(file_) != 0) return Fail("flush failed");
  return Status::OK();
}

Status TraceFile::Close() {
  if (file_ == nullptr) return Status::OK();
  for (auto& kv : tracks_) {
    const int pid = static_cast<int>(kv.first / tid_stride_);
    for (; kv.second.open > 0; --kv.second.open) {
      Element("{\"ph\": \"E\", \"ts\": " + std::to_string(max_ts_) + ", \"pid\": " + std::to_string(pid) +
              ", \"tid\": " + std::to_string(kv.first) + "}");
    }
  }
  if (!seekable_) buffer_ += kTrailer;
  Status st = Flush();
  if (!st.ok()) return st;
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    return Status::Internal("timeline file '" + path_ + "': close failed: " + std::strerror(errno));
  }
  file_ = nullptr;
  return Status::OK();
}

}  // namespace horo
