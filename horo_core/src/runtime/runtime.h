// Runtime: one rank's instance of Horo. It owns the configuration, the transport, the tensor
// queue, the handles, the process sets, the executor and (on rank 0) the coordinator, and runs
// the background thread that negotiates and executes collectives. There is no process-wide
// state: several runtimes can live in one process (the loopback tests do exactly that).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "coordinator/coordinator.h"
#include "coordinator/peer_agreement.h"
#include "coordinator/process_set_table.h"
#include "coordinator/response_cache.h"
#include "coordinator/tensor_queue.h"
#include "horo/horo.h"
#include "runtime/executor.h"
#include "runtime/handle_manager.h"
#include "timeline/timeline.h"
#include "transport/transport.h"
#include "tuning/parameter_manager.h"

namespace horo {

class LoopbackHub;
class ShmTransport;

class Runtime {
 public:
  static Status Create(const horo_init_options_t& options, std::shared_ptr<LoopbackHub> hub,
                       std::unique_ptr<Runtime>* out);
  ~Runtime();

  const std::string& address() const { return address_; }
  // Connects to every peer (addresses[r] is rank r's address(); ignored for loopback) and starts
  // the background thread.
  Status Connect(const std::vector<std::string>& addresses);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }
  ProcessSetTable& process_sets() { return sets_; }
  ExecutorStats stats() const { return executor_->Stats(); }
  // Passes that moved something, by callers (Drive) and by the background thread; how often a
  // driving caller busy-polled before its first yield, and how often it yielded its core.
  void CountPasses(int64_t* by_callers, int64_t* by_background, int64_t* caller_polls, int64_t* caller_yields) const {
    *by_callers = caller_passes_.load();
    *by_background = background_passes_.load();
    *caller_polls = caller_polls_.load();
    *caller_yields = caller_yields_.load();
  }
  // Responses this rank ran after the ranks agreed on them without the coordinator
  // (coordinator/peer_agreement.h), and those the coordinator sent or (rank 0) built; the rounds
  // of that agreement completed.
  void CountResponses(int64_t* agreed_by_peers, int64_t* from_coordinator, int64_t* rounds) const {
    *agreed_by_peers = agreed_responses_.load();
    *from_coordinator = coordinator_responses_.load();
    *rounds = agreed_rounds_.load();
  }
  // Synchronous allreduces and broadcasts RunExpress ran alone, and those it handed over to the queue.
  void CountExpress(int64_t* runs, int64_t* handovers) const {
    *runs = express_runs_.load();
    *handovers = express_handovers_.load();
  }
  HandleManager& handles() { return handles_; }

  Status Enqueue(OpType op, const horo_tensor_t* tensors, int32_t count, const horo_op_options_t& options,
                 horo_handle_t* handles);
  // A synchronous allreduce or broadcast (op) of one tensor (horo_run): runs it on the calling
  // thread when it is a repeated small host collective and nothing else is pending on this rank,
  // without a queued entry or a handle (runtime_express.cc). False when it did not take the call,
  // which then goes through Enqueue and Wait; true when it ran it, *status telling how.
  bool RunExpress(OpType op, const horo_tensor_t& tensor, const horo_op_options_t& options, Status* status);
  // Announces that this rank cannot take part in op on the named tensors (count > 1: one grouped
  // call), for reason; the coordinator fails them on every member (horo_refuse in horo.h).
  Status Refuse(OpType op, const char* const* names, int32_t count, int32_t set_id, const std::string& reason,
                horo_handle_t* handles);
  // Blocks until the handle completes or timeout_seconds (< 0: forever) passes, as
  // HandleManager::Wait; meanwhile the calling thread may run the negotiation and the collectives
  // itself (see runtime_progress.cc).
  Status Wait(int64_t handle, double timeout_seconds);
  // Whether the handle completed (as HandleManager::Poll). A caller that polls in a loop holds its
  // core, which the background thread may need: when callers drive, each poll that finds the
  // handle pending runs one pass itself (unless another thread of this rank runs one), and yields
  // the core when that pass moved nothing.
  Status PollDriving(int64_t handle, bool* done);
  // Starts adding (ranks) or removing (id) a process set; the handle's result value is the id.
  Status ChangeProcessSet(bool add, const std::vector<int32_t>& ranks, int32_t id, horo_handle_t* handle);

  // CUDA tensors: see horo_cuda_enable in horo.h and device/device_executor.h.
  Status EnableCuda(const std::string& nccl_path, int32_t* nccl_version) {
    return executor_->EnableCuda(nccl_path, nccl_version);
  }

  // Asks every rank to shut down, waits for the background thread and closes the transport.
  Status Shutdown();

  // start_timeline()/stop_timeline(), called on every rank (see timeline/timeline.h).
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline();

 private:
  Runtime(const Config& config, int rank, int size);

  // Whether this rank may submit to set_id now: connected, not stopped, a member of the set.
  Status CheckCanSubmit(int32_t set_id);
  // Gives every entry a handle (written to handles) and queues them; on failure releases the handles.
  Status Submit(std::vector<TensorEntry>* entries, horo_handle_t* handles);
  Status ValidateTensor(OpType op, const horo_tensor_t& t, const horo_op_options_t& options) const;
  // The request of one tensor of a call, every field set (*r may be reused from an earlier call).
  void DescribeRequest(OpType op, const horo_tensor_t& t, const horo_op_options_t& options, Request* r) const;
  // A call that failed ValidateTensor with an invalid argument (an unknown reduce op, a tensor of
  // more than 16 dimensions...), which this rank alone may have passed, is refused instead of
  // failed here, so that every member fails with this rank's reason instead of waiting for its
  // tensors; the handles complete with that error. Other errors, and calls without names or with
  // device tensors, are returned as they are.
  Status RefuseInvalid(OpType op, const horo_tensor_t* tensors, int32_t count, int32_t set_id, const Status& invalid,
                       horo_handle_t* handles);
  Status StoppedStatus();
  void FailIfStoppedMeanwhile(const horo_handle_t* handles, size_t count);
  void Loop();
  // One round of negotiation and execution, under progress_mutex_: polls the control plane for up
  // to poll_ms, takes the queued requests, and (rank 0) builds and sends responses; every rank
  // executes the responses it has. *progress tells whether anything happened. Returns false when
  // the runtime stopped. caller_done: the handle of the caller that runs the pass (Drive), if any.
  bool Pass(int poll_ms, bool* progress, const std::atomic<bool>* caller_done = nullptr);
  // One pass on a caller's thread (Drive, PollDriving) whose handle is done: none when nothing is
  // queued or arrived, or when another thread of this rank runs one. Returns whether it moved
  // something.
  bool CallerPass(const std::atomic<bool>& done);
  // A caller waiting on done runs passes while they make progress (see runtime_progress.cc), starting none
  // after deadline.
  void Drive(const std::atomic<bool>& done, std::chrono::steady_clock::time_point deadline);
  // A drive's record of its idle stretch; Moved after each pass that moved something.
  struct DriveState {
    std::chrono::steady_clock::time_point idle_since;
    int idle_rounds = 0;
    int poll = -1;         // whether this drive may busy-poll before yielding: -1 not asked yet, 0, 1
    bool may_poll = true;  // once per idle stretch: a poll that found something, whose pass then moved
                           // nothing (another thread of this rank holds the lock), yields next
    bool polled = false;   // it did
    int yields = 0;
    void Moved() {
      idle_rounds = 0;
      may_poll = true;
    }
  };
  // After a look that found nothing to do: busy-polls for a message or yields the core. False once
  // the drive has been idle for the spin time (HORO_SPIN_MICROSECONDS). timed: a wait with a
  // deadline, which never busy-polls.
  bool IdleRound(DriveState* state, const std::atomic<bool>& done, bool timed);
  // The end of a drive (drivers_ counted it in): its counts, and the background thread told.
  void EndDrive(const DriveState& state, bool finished);
  // RunExpress's parts (runtime_express.cc): whether the call may take that path; its wait for the
  // round (false: the call must continue as a queued one, with the messages from *first on not
  // taken yet); and that hand-over, which releases *lock and waits for the call to complete.
  bool ExpressAllowed(OpType op, const horo_tensor_t& tensor, const horo_op_options_t& options) const;
  bool AwaitExpressRound(DriveState* drive, size_t* first);
  Status HandOverExpress(int64_t id, const horo_tensor_t& tensor, size_t first, const DriveState* drive,
                         std::unique_lock<std::mutex>* lock);
  // Drive's busy poll before it yields, while it pays off (see runtime_progress.cc): whether this drive may
  // poll; then one poll, true when a control message came or done was set within limit.
  bool PollAllowed();
  bool PollForMessage(const std::atomic<bool>& done, std::chrono::steady_clock::duration limit);
  // After a drive that polled: paid_off when it finished without yielding at all.
  void ScorePoll(bool paid_off);
  // The background thread between passes when callers may drive; wait_ms: its longest sleep, which
  // the last pass computed (from poll_ms_ and the timeline's shipping, both read under the lock).
  void BackgroundWait(std::chrono::steady_clock::time_point spin_until, int wait_ms);
  // Makes the background thread run a pass soon, whatever it is waiting on; unless_parked: except
  // while it is parked after a caller's drive (BackgroundWait), which ends within kParkTime anyway.
  void WakeBackground(bool unless_parked = false);
  // After Enqueue: wakes the background thread unless a caller will run the request (runtime_progress.cc).
  void WakeAfterEnqueue(bool caller_waits);
  // Executes a response list; returns false when the loop must end.
  bool Apply(ResponseList& list, bool parsed);
  bool ApplyMessage(const ControlMessage& message);
  // Peer agreement (coordinator/peer_agreement.h), inside a pass: decides whether to use it, with
  // every rank, at connect time; sends this rank's round messages, completes the rounds that have
  // every message and runs what they agreed on, applying held response lists in their place.
  // Returns false when the loop must end.
  // Once caller_done is set, a message that would only answer a peer's round is left to the next
  // pass (answer_owed_): see runtime_progress.cc.
  Status DecidePeerAgreement();
  bool AdvanceRounds(bool* progress, const std::atomic<bool>* caller_done);
  // Rank 0: builds the coordinator's response lists, sends them and applies them, until none is
  // due (with peer agreement, only between rounds). Returns false when the loop must end.
  bool RespondAsCoordinator(bool* progress);
  // A peer's round message goes to the agreement (*taken tells whether message was one).
  bool TakeRoundMessage(const ControlMessage& message, bool* taken);
  // The control messages from messages[first] on, and the peers a poll found lost: round messages
  // to the agreement; request lists to the coordinator (rank 0); the coordinator's lists applied
  // or held (workers). Returns false when the loop must end.
  bool TakeControl(const std::vector<ControlMessage>& messages, size_t first, const std::vector<int>& lost);
  // Rank 0: the coordinator's look for stalled tensors, every few milliseconds.
  void CheckStallsIfDue();
  // This rank's round message to every peer; false (the runtime stopped) when a live peer could
  // not be sent it.
  bool SendRound(const std::string& payload);
  // A worker's response list from the coordinator: applied now, or held until its round.
  bool ReceiveResponseList(const ControlMessage& message);
  // Autotune: rank 0 lets the tuner see (and annotate) a list before sending it; every rank
  // applies the parameters a list carries before its responses.
  void TuneOnCoordinator(ResponseList* list);
  void ApplyParameters(const TunedParameters& parameters);
  void StopAfterCoordinatorLoss(const std::string& detail);
  // Workers: a rank 0 that is stopped or stuck sends nothing and closes nothing. While this rank
  // waits for a collective or in shutdown(), rank 0's silence is warned about after the stall time, and ends the
  // job after the stall shutdown time plus the peer timeout (rank 0, if alive, has shut the job
  // down by then), naming the ranks the round of peer agreement waits for where that explains the
  // silence. False when it stopped the runtime.
  bool WatchCoordinator();
  // "rank 3" or "ranks 2, 3": those whose message the open round of peer agreement still lacks,
  // when rank 0's is in (so rank 0's silence is theirs); empty otherwise. Under progress_mutex_.
  std::string RoundHeldBy() const;
  // The same for the members that have not announced the cached tensor name (empty when it is not
  // announced by anyone, or not cached). Under progress_mutex_.
  std::string NotAnnouncedBy(const std::string& name) const;
  void FailOnDataPlane(const Status& status);
  // A failure found on this rank: a worker first tells the coordinator why, which ends the job on
  // every rank with that cause; rank 0 tells the workers (Stop).
  void ReportAndStop(const Status& status);
  std::string DiagnoseOnCoordinator(const Status& local);
  void Stop(const Status& reason, bool failure);
  void Linger(double seconds);

  Config config_;
  int rank_;
  int size_;
  std::string address_;
  std::unique_ptr<Transport> transport_;
  ShmTransport* network_ = nullptr;  // transport_ when ranks are processes (TCP + shared memory), for Connect
  ProcessSetTable sets_;
  ResponseCache cache_;
  TensorQueue queue_;
  HandleManager handles_;
  std::unique_ptr<Timeline> timeline_;  // before its users, so that it outlives them
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ParameterManager> tuner_;  // rank 0 with HORO_AUTOTUNE only
  std::unique_ptr<PeerAgreement> agreement_;  // set by Connect when every rank can use it
  std::deque<ResponseList> held_lists_;       // workers: lists whose round is not complete yet
  std::string round_payload_;                 // AdvanceRounds' scratch, kept for its storage
  std::vector<Request> taken_;                // Pass's scratch, kept for its storage
  std::vector<AgreedStep> agreed_run_;        // AdvanceRounds' scratch, kept for its storage
  std::vector<ControlMessage> pass_messages_;  // Pass's, kept for its storage (and its payloads')
  std::vector<int> pass_lost_;                 // Pass's scratch
  Request express_request_;                    // RunExpress's, kept for its storage
  std::vector<const char*> express_contributions_;  // RunExpress's, kept for its storage
  std::atomic<int64_t> agreed_responses_{0};
  std::atomic<int64_t> agreed_rounds_{0};
  std::atomic<int64_t> coordinator_responses_{0};
  std::atomic<int64_t> express_runs_{0};
  std::atomic<int64_t> express_handovers_{0};
  double cycle_time_ms_;                     // HORO_CYCLE_TIME, or what the autotuner chose

  // Who makes progress (runtime_progress.cc).
  bool callers_drive_ = false;     // set by Connect: the transport can wait without reading
  std::mutex progress_mutex_;      // one Pass at a time
  std::atomic<bool> loop_ended_{false};
  std::atomic<int> drivers_{0};    // callers inside Drive
  std::atomic<int64_t> caller_passes_{0};
  std::atomic<int64_t> background_passes_{0};
  std::atomic<int64_t> caller_polls_{0};
  std::atomic<int64_t> caller_yields_{0};
  std::atomic<int64_t> last_drive_ns_{0};  // steady-clock time the last Drive, or Wait found done, ended
  bool poll_allowed_ = false;              // set by Connect: this host has a CPU per local rank
  std::atomic<int> poll_score_{0};         // PollAllowed: on while > 0
  std::atomic<int> poll_skip_{0};          // while the score is 0: drives until the next probe
  std::atomic<int> poll_backoff_{0};       // ... and the skip after the next probe that fails (0: the first)
  std::atomic<bool> answer_owed_{false};    // a peer's round waits for this rank's message
  int64_t deferred_round_ = 0;              // the last round answered late; under progress_mutex_
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  bool park_wake_ = false;         // under park_mutex_
  bool parked_ = false;            // under park_mutex_: BackgroundWait is in park_cv_'s wait
  int poll_ms_ = 1000;             // the coordinator's stall checks set it; under progress_mutex_
  int64_t last_stall_check_ns_ = 0;  // CoarseNanos of the last stall check; under progress_mutex_
  // Workers: when rank 0 last sent this rank anything, and the watch on its silence (WatchCoordinator).
  int64_t heard_from_coordinator_ns_ = 0;   // under progress_mutex_
  int64_t last_coordinator_watch_ns_ = 0;   // under progress_mutex_
  bool coordinator_silence_warned_ = false;  // under progress_mutex_

  std::thread thread_;
  std::mutex shutdown_mutex_;  // one Shutdown at a time
  std::atomic<bool> started_{false};
  std::atomic<bool> shutdown_requested_{false};
  bool shutdown_sent_ = false;
  int64_t shutdown_sent_ns_ = 0;  // when (CoarseNanos), for WatchCoordinator
  std::atomic<bool> stopped_{false};
  std::mutex stop_mutex_;
  Status stop_reason_;
  std::mutex counter_mutex_;
  std::map<int32_t, int64_t> barrier_counts_;
  int64_t set_change_count_ = 0;
};

}  // namespace horo
