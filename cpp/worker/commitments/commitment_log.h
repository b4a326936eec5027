// What a hop committed to, per route session and position (docs/adr/0008-verified-outputs.md):
// the top-K magnitudes of each hidden row it received and sent (indices and float16 values),
// the token fed at each position (first hop), and the token sampled from each position's logits
// with its logit (last hop). An audit reads them back (ShardService::Commitments) and compares
// them with its own replay of the session.
//
// Bounded: at most `max_positions` positions over all sessions are kept; past that, the
// sessions written least recently are dropped whole, and so are sessions not written for
// `retain`. A position written again (speculation rewound it) is overwritten. Thread-safe.
#ifndef MESHNET_CPP_WORKER_COMMITMENTS_COMMITMENT_LOG_H_
#define MESHNET_CPP_WORKER_COMMITMENTS_COMMITMENT_LOG_H_

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace meshnet::worker {

inline constexpr int kCommitmentK = 8;

struct CommitmentOptions {
  size_t max_positions = 262144;  // over all sessions (~20 MiB at 76 bytes each)
  std::chrono::seconds retain{600};
};

// One session's commitments, position by position (index = position).
struct CommitmentRecord {
  std::vector<int32_t> input_tokens;     // first hop; -1 where not written
  std::vector<uint16_t> input_indices;   // K per position
  std::vector<uint16_t> input_values;    // float16 bits, K per position
  std::vector<uint16_t> output_indices;
  std::vector<uint16_t> output_values;
  std::vector<int32_t> sampled_tokens;   // last hop; -1 where none was sampled
  std::vector<uint16_t> sampled_logits;  // float16 bits
  float temperature = 0.0f;
  bool constrained = false;  // sampled under a grammar
  size_t positions() const { return sampled_tokens.size(); }
};

// The K largest magnitudes of `row` (n floats): indices in descending magnitude, values as
// float16 bits.
void TopK(const float* row, int n, uint16_t* indices, uint16_t* values);

class CommitmentLog {
 public:
  using Key = std::pair<std::string, uint64_t>;  // (session id, epoch)
  using Clock = std::chrono::steady_clock;

  explicit CommitmentLog(CommitmentOptions options = {}) : options_(options) {}

  void InputTokens(const Key& key, uint32_t start, const std::vector<int32_t>& tokens);
  // `count` rows of `n_embd` floats for positions start.. (input: received; else sent).
  void Rows(const Key& key, uint32_t start, const float* rows, uint32_t count, int n_embd, bool input);
  void Sampled(const Key& key, uint32_t position, int32_t token, float logit, float temperature,
               bool constrained = false);
  // Positions [start, start + count) of `key` (fewer when it holds fewer); false when the
  // session is not held (never seen, or dropped).
  bool Read(const Key& key, uint32_t start, uint32_t count, CommitmentRecord* out, uint32_t* got);
  size_t positions() const;  // held over all sessions

 private:
  struct Entry {
    CommitmentRecord record;
    Clock::time_point written;
    std::list<Key>::iterator order;  // in recency_, most recent at the back
  };
  // The record for `key`, grown to hold `end` positions, marked written now; evicts others.
  CommitmentRecord& Grow(const Key& key, uint32_t end);
  void Evict();

  const CommitmentOptions options_;
  mutable std::mutex mu_;
  std::map<Key, Entry> sessions_;
  std::list<Key> recency_;
  size_t positions_ = 0;
};

}  // namespace meshnet::worker

#endif  // MESHNET_CPP_WORKER_COMMITMENTS_COMMITMENT_LOG_H_
