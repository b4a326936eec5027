// Tensor bundles on the seam: canonical fragmenting (EncodeBundle) and bounded reassembly
// (Reassembler), exactly as docs/adr/0002-seam-protocol-v1.md specifies. Byte-for-byte equal
// to python/meshnet/protocol/; tests/golden/ holds frames both codecs must reproduce.
//
// Invariants: every fragment's data is <= Limits::max_fragment_bytes; a Reassembler never
// allocates more than a header's declared, limit-checked wire_bytes (plus payload_bytes when it
// decompresses); every malformed input yields a non-OK Status with a message, never a crash.
#ifndef MESHNET_CPP_PROTOCOL_BUNDLE_H_
#define MESHNET_CPP_PROTOCOL_BUNDLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpp/wire/status.h"
#include "cpp/wire/tensor.h"

namespace meshnet::shard::v1 {
class BundleHeader;
class TensorFragment;
class TensorSpec;
}  // namespace meshnet::shard::v1

namespace meshnet::protocol {

// Both codecs default to these (ADR 0002, "Limits").
struct Limits {
  uint64_t max_fragment_bytes = 1 << 20;        // data bytes per fragment
  uint64_t max_bundle_bytes = 256ull << 20;     // payload and wire payload bytes
  uint32_t max_tensors = 16;                    // tensors per bundle
  uint32_t max_rank = 4;                        // dims per tensor
  uint32_t max_name_bytes = 128;                // UTF-8 bytes of a tensor name
  // ceil(max_bundle_bytes / max_fragment_bytes): the most fragments a bundle may have.
  uint32_t max_fragments() const;
};

void ToProto(const TensorSpec& in, meshnet::shard::v1::TensorSpec* out);
void ToProto(const BundleHeader& in, meshnet::shard::v1::BundleHeader* out);
void ToProto(const TensorFragment& in, meshnet::shard::v1::TensorFragment* out);
void FromProto(const meshnet::shard::v1::TensorSpec& in, TensorSpec* out);
void FromProto(const meshnet::shard::v1::BundleHeader& in, BundleHeader* out);
void FromProto(const meshnet::shard::v1::TensorFragment& in, TensorFragment* out);

// Encodes `tensors` (in order; little-endian bytes) as the canonical fragments of one bundle,
// each carrying at most `fragment_bytes` (1..limits.max_fragment_bytes) of the wire payload.
// Replaces *out. Errors: INVALID_ARGUMENT for a bad name, dtype, shape, byte count, empty
// bundle or fragment_bytes 0; RESOURCE_EXHAUSTED for a tensor, fragment or size limit.
Status EncodeBundle(const std::vector<Tensor>& tensors, uint64_t bundle_id,
                    Compression compression, uint64_t fragment_bytes, const Limits& limits,
                    std::vector<TensorFragment>* out);
Status EncodeBundle(const std::vector<Tensor>& tensors, uint64_t bundle_id,
                    Compression compression, uint64_t fragment_bytes, const Limits& limits,
                    std::vector<meshnet::shard::v1::TensorFragment>* out);

// Collects the fragments of one bundle at a time: fragment 0 (with the header, validated on
// arrival) first, the others in any order. After any error the reassembler is empty again (the
// bundle in progress is dropped), so the next bundle starts clean.
// Not thread-safe: one owner (the seam stream's reader) calls every method.
class Reassembler {
 public:
  explicit Reassembler(Limits limits = Limits());

  // Accepts one fragment. A fragment of another bundle_id while a bundle is incomplete is
  // "missing fragments" (INVALID_ARGUMENT).
  Status Add(const TensorFragment& fragment);
  Status Add(const meshnet::shard::v1::TensorFragment& fragment);
  // True once all `count` fragments of the current bundle were added.
  bool complete() const;
  // Requires complete(). Decompresses (output capped at payload_bytes), checks every CRC and
  // returns the tensors little-endian (big-endian ones are swapped). Empties the reassembler.
  Status Take(std::vector<Tensor>* out);
  // End of step: INVALID_ARGUMENT if a bundle is still held (incomplete: "missing
  // fragments"; complete: not taken). Empties the reassembler.
  Status Finish();
  // Drops any bundle in progress.
  void Reset();
  // Limits for the bundles that start after this call; call between bundles (the worker does
  // when fragment 0 arrives) to bound each step's bundle by what that step may carry.
  void set_limits(const Limits& limits) { limits_ = limits; }

 private:
  Status AddSlice(uint64_t bundle_id, uint32_t index, uint32_t count,
                  const BundleHeader* header, std::string_view data);
  Status StartBundle(uint64_t bundle_id, uint32_t count, const BundleHeader& header,
                     uint64_t first_size);

  Limits limits_;
  bool active_ = false;      // fragment 0 of bundle_id_ was accepted
  uint64_t bundle_id_ = 0;
  uint32_t count_ = 0;
  uint32_t received_ = 0;    // distinct fragments stored
  std::vector<bool> seen_;   // by index; count_ (<= max_fragments) entries
  uint64_t slice_bytes_ = 0; // fragment 0's size; fragment i starts at i * slice_bytes_
  BundleHeader header_;
  std::unique_ptr<uint8_t[]> wire_;  // header_.wire_bytes bytes, allocated by StartBundle
};

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_BUNDLE_H_
