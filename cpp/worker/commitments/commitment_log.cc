#include "cpp/worker/commitments/commitment_log.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ggml.h"

namespace meshnet::worker {

void TopK(const float* row, int n, uint16_t* indices, uint16_t* values) {
  const int k = std::min(kCommitmentK, n);
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [row](int a, int b) { return std::fabs(row[a]) > std::fabs(row[b]); });
  for (int i = 0; i < kCommitmentK; ++i) {
    indices[i] = i < k ? static_cast<uint16_t>(order[i]) : 0;
    values[i] = i < k ? ggml_fp32_to_fp16(row[order[i]]) : 0;
  }
}

CommitmentRecord& CommitmentLog::Grow(const Key& key, uint32_t end) {
  auto found = sessions_.find(key);
  if (found == sessions_.end()) {
    recency_.push_back(key);
    found = sessions_.emplace(key, Entry{CommitmentRecord{}, Clock::now(), std::prev(recency_.end())}).first;
  } else {
    recency_.splice(recency_.end(), recency_, found->second.order);
    found->second.written = Clock::now();
  }
  CommitmentRecord& record = found->second.record;
  const size_t held = record.positions();
  if (end > held) {
    positions_ += end - held;
    record.input_tokens.resize(end, -1);
    record.input_indices.resize(size_t{end} * kCommitmentK, 0);
    record.input_values.resize(size_t{end} * kCommitmentK, 0);
    record.output_indices.resize(size_t{end} * kCommitmentK, 0);
    record.output_values.resize(size_t{end} * kCommitmentK, 0);
    record.sampled_tokens.resize(end, -1);
    record.sampled_logits.resize(end, 0);
  }
  Evict();
  return sessions_.find(key)->second.record;  // Evict keeps the most recent session
}

void CommitmentLog::Evict() {
  const Clock::time_point stale = Clock::now() - options_.retain;
  while (recency_.size() > 1) {
    auto oldest = sessions_.find(recency_.front());
    if (positions_ <= options_.max_positions && oldest->second.written >= stale) break;
    positions_ -= oldest->second.record.positions();
    sessions_.erase(oldest);
    recency_.pop_front();
  }
}

void CommitmentLog::InputTokens(const Key& key, uint32_t start, const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  CommitmentRecord& record = Grow(key, start + static_cast<uint32_t>(tokens.size()));
  std::copy(tokens.begin(), tokens.end(), record.input_tokens.begin() + start);
}

void CommitmentLog::Rows(const Key& key, uint32_t start, const float* rows, uint32_t count, int n_embd,
                         bool input) {
  std::vector<uint16_t> indices(size_t{count} * kCommitmentK), values(size_t{count} * kCommitmentK);
  for (uint32_t r = 0; r < count; ++r) {  // outside the lock: the sort is the costly part
    TopK(rows + size_t{r} * n_embd, n_embd, &indices[size_t{r} * kCommitmentK], &values[size_t{r} * kCommitmentK]);
  }
  std::lock_guard<std::mutex> lock(mu_);
  CommitmentRecord& record = Grow(key, start + count);
  auto& to_indices = input ? record.input_indices : record.output_indices;
  auto& to_values = input ? record.input_values : record.output_values;
  std::copy(indices.begin(), indices.end(), to_indices.begin() + size_t{start} * kCommitmentK);
  std::copy(values.begin(), values.end(), to_values.begin() + size_t{start} * kCommitmentK);
}

void CommitmentLog::Sampled(const Key& key, uint32_t position, int32_t token, float logit, float temperature,
                            bool constrained) {
  std::lock_guard<std::mutex> lock(mu_);
  CommitmentRecord& record = Grow(key, position + 1);
  record.sampled_tokens[position] = token;
  record.sampled_logits[position] = ggml_fp32_to_fp16(logit);
  record.temperature = temperature;
  record.constrained = constrained;
}

bool CommitmentLog::Read(const Key& key, uint32_t start, uint32_t count, CommitmentRecord* out, uint32_t* got) {
  std::lock_guard<std::mutex> lock(mu_);
  Evict();
  auto found = sessions_.find(key);
  if (found == sessions_.end()) return false;
  const CommitmentRecord& record = found->second.record;
  const uint32_t held = static_cast<uint32_t>(record.positions());
  const uint32_t first = std::min(start, held);
  const uint32_t n = std::min(count, held - first);
  auto slice = [&](const auto& from, auto& to, size_t per) {
    to.assign(from.begin() + size_t{first} * per, from.begin() + size_t{first + n} * per);
  };
  slice(record.input_tokens, out->input_tokens, 1);
  slice(record.input_indices, out->input_indices, kCommitmentK);
  slice(record.input_values, out->input_values, kCommitmentK);
  slice(record.output_indices, out->output_indices, kCommitmentK);
  slice(record.output_values, out->output_values, kCommitmentK);
  slice(record.sampled_tokens, out->sampled_tokens, 1);
  slice(record.sampled_logits, out->sampled_logits, 1);
  out->temperature = record.temperature;
  out->constrained = record.constrained;
  *got = n;
  return true;
}

size_t CommitmentLog::positions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return positions_;
}

}  // namespace meshnet::worker
