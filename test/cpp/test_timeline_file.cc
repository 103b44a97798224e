// sources: timeline/event_batch.cc timeline/trace_file.cc common/dtype.cc
//
// The timeline's two formats: EventBatch (what ranks ship to rank 0) round-trips, and its parser
// fails cleanly on every truncation and on corrupted bytes; TraceFile (the Chrome trace JSON)
// drops events from before its start and ends whose begin it never saw, closes the slices still
// open, escapes names, and is a complete JSON array after every flush, on a regular file and on a
// pipe (which cannot seek back over the closing bracket). Exits 1 on the first failure.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "timeline/event_batch.h"
#include "timeline/trace_file.h"
#include "unit_check.h"

using horo::EventBatch;
using horo::ParsedEventBatch;
using horo::TraceFile;
using horo::TraceTensor;
using horo::TraceTrack;
using horo_test::Check;
using horo_test::CheckCode;
using horo_test::CheckOk;

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A batch with a fused group of two tensors, a negotiation, a marker and an error message.
std::string SampleBatch(int64_t t0, bool final) {
  EventBatch b;
  std::vector<TraceTensor> tensors(2);
  tensors[0].name = "grad.a";
  tensors[0].dtype = HORO_FLOAT32;
  tensors[0].shape = {2, 3};
  tensors[1].name = "grad \"b\"\\\n";
  tensors[1].dtype = HORO_INT64;
  tensors[1].shape = {};
  const int32_t fused = b.AddGroup(1, tensors);
  b.AddEvent(fused, TraceTrack::kRank, 'B', t0 + 10, "ALLREDUCE");
  b.AddEvent(fused, TraceTrack::kRank, 'B', t0 + 10, "QUEUE");
  b.AddEvent(fused, TraceTrack::kRank, 'E', t0 + 12, "");
  b.AddEvent(fused, TraceTrack::kRank, 'E', t0 + 20, "", true);
  const int32_t single = b.AddTensor(0, "neg");
  Check(b.AddTensor(0, "neg") == single, "AddTensor reuses the group of the same tensor");
  b.AddEvent(single, TraceTrack::kNegotiation, 'B', t0 + 1, "NEGOTIATE_ALLREDUCE");
  b.AddEvent(single, TraceTrack::kNegotiation, 'X', t0 + 2, "1");
  b.AddEvent(single, TraceTrack::kNegotiation, 'E', t0 + 3, "", false, {{"message", "boom"}});
  b.AddMarker(t0 + 4, "CYCLE_START");
  Check(b.AddTensor(0, "other") != single, "AddTensor declares a new group for another tensor");
  Check(!b.empty(), "batch with records is not empty");
  return b.Take(final, t0 + 99);
}

void TestBatchRoundTrip() {
  const std::string bytes = SampleBatch(1000, true);
  ParsedEventBatch p;
  CheckOk(horo::ParseEventBatch(bytes, &p), "parse sample batch");
  Check(p.final && p.shipped_us == 1099, "final flag and shipping time survive");
  Check(p.groups.size() == 3 && p.groups[0].process_set_id == 1 && p.groups[0].tensors.size() == 2,
        "groups survive");
  Check(p.groups[0].tensors[1].name == "grad \"b\"\\\n" && p.groups[0].tensors[0].shape.size() == 2 &&
            p.groups[0].tensors[0].dtype == HORO_FLOAT32,
        "tensor names, dtypes and shapes survive");
  Check(p.events.size() == 8, "every event survives, got " + std::to_string(p.events.size()));
  Check(p.events[3].tensor_args && p.events[3].phase == 'E' && p.events[3].ts_us == 1020, "op end event");
  Check(p.events[6].args.size() == 1 && p.events[6].args[0].second == "boom", "event args survive");
  Check(p.events[7].marker && p.events[7].name == "CYCLE_START", "marker survives");
  bool final = false;
  int64_t shipped = 0;
  Check(horo::ReadBatchEnd(bytes, &final, &shipped) && final && shipped == 1099, "ReadBatchEnd reads the trailer");
  EventBatch empty;
  Check(empty.empty(), "new batch is empty");
  const std::string heartbeat = empty.Take(false, 5);
  CheckOk(horo::ParseEventBatch(heartbeat, &p), "parse empty batch");
  Check(!p.final && p.events.empty() && p.shipped_us == 5, "an empty batch says how far a rank shipped");
  std::printf("ok   event batch round trip\n");
}

void TestBatchRejectsBadInput() {
  const std::string bytes = SampleBatch(1000, false);
  for (size_t n = 0; n < bytes.size(); ++n) {
    ParsedEventBatch p;
    CheckCode(horo::ParseEventBatch(bytes.substr(0, n), &p), HORO_ERR_INTERNAL, "timeline batch",
              "truncation to " + std::to_string(n) + " bytes");
  }
  ParsedEventBatch p;
  CheckCode(horo::ParseEventBatch(bytes + "x", &p), HORO_ERR_INTERNAL, "trailing bytes", "a byte after the end record");
  // An event naming a group the batch never declared.
  EventBatch b;
  b.AddEvent(3, TraceTrack::kRank, 'B', 1, "ALLREDUCE");
  CheckCode(horo::ParseEventBatch(b.Take(false, 1), &p), HORO_ERR_INTERNAL, "malformed event", "undeclared group");
  // Corrupted bytes: an error or a parse, never a crash or a huge allocation.
  std::mt19937 rng(7);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = bytes;
    for (int k = 0; k < 3; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    if (!horo::ParseEventBatch(bad, &p).ok()) ++rejected;
  }
  Check(rejected > 0, "corruption is noticed at least sometimes");
  std::printf("ok   event batch rejects truncated and corrupted input (%d of 2000 corruptions rejected)\n", rejected);
}

void TestTraceFile(const std::string& dir) {
  const std::string path = dir + "/trace.json";
  TraceFile file;
  CheckOk(file.Open(path, 1000, 3), "open trace file");
  std::string text = ReadFile(path);
  Check(text.rfind("[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": "
                   "{\"start_time_since_epoch_in_micros\": 1000}}",
                   0) == 0,
        "header first: " + text.substr(0, 120));
  Check(text.size() >= 3 && text.substr(text.size() - 3) == "\n]\n", "a complete array right after Open");

  // Events from before the start (ts < 1000) and the end of a slice begun then are dropped.
  EventBatch early;
  const int32_t g = early.AddTensor(0, "early");
  early.AddEvent(g, TraceTrack::kRank, 'B', 900, "ALLREDUCE");
  early.AddEvent(g, TraceTrack::kRank, 'B', 1001, "QUEUE");
  early.AddEvent(g, TraceTrack::kRank, 'E', 1002, "");
  early.AddEvent(g, TraceTrack::kRank, 'E', 1003, "");
  ParsedEventBatch p;
  CheckOk(horo::ParseEventBatch(early.Take(false, 1004), &p), "parse early batch");
  file.Append(2, p);
  CheckOk(horo::ParseEventBatch(SampleBatch(1000, false), &p), "parse sample batch");
  file.Append(1, p);
  CheckOk(file.Flush(), "flush");
  text = ReadFile(path);
  Check(Count(text, "\n]\n") == 1 && text.substr(text.size() - 3) == "\n]\n",
        "after a flush the closing bracket is only at the end");
  Check(text.find("\"ts\": -") == std::string::npos, "no event from before the start");
  Check(Count(text, "\"name\": \"QUEUE\"") == 3, "QUEUE of early and of both fused tensors");
  Check(text.find("\"name\": \"grad \\\"b\\\"\\\\\\u000a (process set 1)\"") != std::string::npos,
        "names are escaped and labelled with their process set");
  Check(text.find("\"args\": {\"dtype\": \"float32\", \"shape\": \"[2, 3]\"}") != std::string::npos,
        "op end carries dtype and shape");
  Check(text.find("\"name\": \"rank 1\"") != std::string::npos && text.find("\"name\": \"negotiation\"") != std::string::npos,
        "tracks are named");
  // Three ranks: stride 10, so rank 1's track of pid 2 is tid 22 and negotiation of pid 4 is 40.
  Check(text.find("\"pid\": 2, \"tid\": 22") != std::string::npos, "tid = pid * 10 + rank + 1");
  Check(text.find("{\"ph\": \"i\", \"name\": \"CYCLE_START\", \"ts\": 4, \"s\": \"g\"}") != std::string::npos,
        "markers are global instants");

  // A slice left open (the timeline stopped mid-operation) is ended by Close.
  EventBatch open;
  const int32_t h = open.AddTensor(0, "open");
  open.AddEvent(h, TraceTrack::kRank, 'B', 1500, "BROADCAST");
  open.AddEvent(h, TraceTrack::kRank, 'B', 1500, "BINOMIAL_TREE_BROADCAST");
  CheckOk(horo::ParseEventBatch(open.Take(false, 1501), &p), "parse open batch");
  file.Append(0, p);
  CheckOk(file.Close(), "close");
  Check(!file.is_open(), "closed");
  text = ReadFile(path);
  Check(Count(text, "\"ph\": \"B\"") == Count(text, "\"ph\": \"E\""), "every begin has an end after Close");
  Check(text.find("{\"ph\": \"E\", \"ts\": 500, \"pid\": 5, \"tid\": 51}") != std::string::npos,
        "open slices end at the last timestamp");
  Check(Count(text, "\n]\n") == 1 && text.substr(text.size() - 3) == "\n]\n", "closed file ends the array once");
  std::printf("ok   trace file: start, drops, escaping, tracks, close\n");
}

void TestTraceFileOnPipe(const std::string& dir) {
  const std::string path = dir + "/pipe";
  Check(mkfifo(path.c_str(), 0600) == 0, "mkfifo");
  std::string received;
  std::thread reader([&] { received = ReadFile(path); });
  TraceFile file;
  CheckOk(file.Open(path, 0, 2), "open a pipe");
  ParsedEventBatch p;
  CheckOk(horo::ParseEventBatch(SampleBatch(0, false), &p), "parse sample batch");
  file.Append(1, p);
  CheckOk(file.Flush(), "flush a pipe");
  file.Append(1, p);
  CheckOk(file.Close(), "close a pipe");
  reader.join();
  Check(received.rfind("[\n", 0) == 0 && Count(received, "\n]\n") == 1 &&
            received.substr(received.size() - 3) == "\n]\n",
        "a pipe gets one array, closed once at the end");
  std::printf("ok   trace file on a pipe\n");
}

void TestTraceFileOpenError(const std::string& dir) {
  TraceFile file;
  const std::string path = dir + "/missing/trace.json";
  CheckCode(file.Open(path, 0, 2), HORO_ERR_INVALID_ARGUMENT, path, "open in a missing directory");
  CheckCode(file.Open(path, 0, 2), HORO_ERR_INVALID_ARGUMENT, "No such file or directory", "the reason is given");
  Check(!file.is_open(), "nothing open after a failure");
  std::printf("ok   trace file open error names the path and the reason\n");
}

}  // namespace

int main() {
  char dir_template[] = "/tmp/horo-timeline-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  Check(dir != nullptr, "mkdtemp");
  TestBatchRoundTrip();
  TestBatchRejectsBadInput();
  TestTraceFile(dir);
  TestTraceFileOnPipe(dir);
  TestTraceFileOpenError(dir);
  std::remove((std::string(dir) + "/trace.json").c_str());
  std::remove((std::string(dir) + "/pipe").c_str());
  rmdir(dir);
  return 0;
}
